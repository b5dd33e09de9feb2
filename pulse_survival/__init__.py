"""pulse_survival: the P0 layer every Engine runs outermost (filled by the survival issue)."""

from pulse_survival.layer import SurvivalLayer, survival_layer

__all__ = ["SurvivalLayer", "survival_layer"]
