"""`upulse completion bash|zsh`: a shell completion script generated from the argument parser.

One bash function completes every command, option and option value the parser knows (the
values of `choices`, folders for `--home`, the instances for `--instance`, the catalogue's
kinds for `--kind`); zsh runs the same function through its bash-completion emulation
(bashcompinit), so both shells complete exactly what the parser accepts, with no dependency.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Iterator, Mapping, Sequence

from pulse_cli.home import Home

INSTANCES = '$(command ls "${UPULSE_HOME:-$HOME/.upulse}/instances" 2>/dev/null)'

ZSH_PREAMBLE = """\
# zsh completion for upulse: add `eval "$(upulse completion zsh)"` to ~/.zshrc
autoload -U +X compinit && compinit
autoload -U +X bashcompinit && bashcompinit
"""
BASH_PREAMBLE = """\
# bash completion for upulse: add `eval "$(upulse completion bash)"` to ~/.bashrc
"""


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
              ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every (command path, parser) of the tree, the top-level parser first; commands listed
    without help (internal ones, like `daemon run`) are left out."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            listed = {choice.dest for choice in action._choices_actions}
            for name, sub in action.choices.items():
                if name in listed:
                    yield from _commands(sub, (*path, name))


def _words(parser: argparse.ArgumentParser) -> list[str]:
    """What may follow a command: its subcommands, its positional choices, its options."""
    words: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            words += [choice.dest for choice in action._choices_actions]
        elif action.option_strings:
            words += action.option_strings
        elif action.choices is not None:
            words += [str(choice) for choice in action.choices]
    return words


def _reply(words: str) -> str:
    return f'COMPREPLY=($(compgen -W "{words}" -- "$cur")); return ;;'


HOME_OPTIONS = (
    "        *:--home) COMPREPLY=($(compgen -d -- \"$cur\")); return ;;",
    f"        *:--instance) {_reply(INSTANCES)}",
)


def _value(action: argparse.Action, values: Mapping[str, Sequence[str]]) -> str:
    """The completion of the value of an option that takes one."""
    if action.choices is not None:
        return _reply(" ".join(str(choice) for choice in action.choices))
    for option in action.option_strings:
        if option in values:
            return _reply(" ".join(values[option]))
    return "COMPREPLY=(); return ;;"  # free text: nothing to offer


def bash_function(parser: argparse.ArgumentParser, values: Mapping[str, Sequence[str]]) -> str:
    """The `_upulse` completion function and its `complete` registration.

    `values` lists the values of options the parser cannot know (such as `--kind`'s kinds).
    The words before the current one give the command path; the previous word, when it is
    an option that takes a value, gives what to complete.
    """
    tree = list(_commands(parser))
    steps = " | ".join(shlex.quote(f"{' '.join(path[:-1])}:{path[-1]}")
                       for path, _ in tree if path)
    options = list(HOME_OPTIONS)  # every command takes them
    for path, command in tree:
        for action in command._actions:
            if action.option_strings and action.nargs != 0 and action.dest not in (
                    "home", "instance"):
                cases = " | ".join(shlex.quote(f"{' '.join(path)}:{option}")
                                   for option in action.option_strings)
                options.append(f"        {cases}) {_value(action, values)}")
    words = [f"        {shlex.quote(' '.join(path))}) words={shlex.quote(' '.join(_words(c)))} ;;"
             for path, c in tree]
    return "\n".join([
        "_upulse() {",
        '    local cur="$2" prev="$3" path="" word words="" n=0',
        '    for word in "${COMP_WORDS[@]}"; do',
        "        n=$((n + 1))",
        "        ((n == 1)) && continue",
        "        ((n > COMP_CWORD)) && break",
        '        case "$path:$word" in',
        f'            {steps}) path="${{path:+$path }}$word" ;;',
        "        esac",
        "    done",
        '    case "$path:$prev" in',
        *options,
        "    esac",
        '    case "$path" in',
        *words,
        "    esac",
        '    COMPREPLY=($(compgen -W "$words" -- "$cur"))',
        "}",
        "complete -F _upulse upulse",
        "",
    ])


def script(shell: str, parser: argparse.ArgumentParser,
           values: Mapping[str, Sequence[str]]) -> str:
    """The completion script for `shell` ("bash" or "zsh")."""
    preamble = ZSH_PREAMBLE if shell == "zsh" else BASH_PREAMBLE
    return preamble + bash_function(parser, values)


def print_script(home: Home, *, shell: str) -> int:
    """Print the completion script of `upulse` for `shell`."""
    from pulse_cli.main import build_parser
    from pulse_cli.queries import catalogued_kinds

    print(script(shell, build_parser(), {"--kind": sorted(catalogued_kinds())}), end="")
    return 0
