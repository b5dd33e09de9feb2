"""An engine directory: this agent's business rules, watchers and executors, as one package.

`upulse init` copies pulse's engine_template here. engine.py exports what the Engine runs as
one layer, made for the home it runs on by `layer(settings, context)`; the modules import
each other relatively (`from ..types import InboxReading`), so the loader can import the
directory under a fresh name on every reload.
"""
