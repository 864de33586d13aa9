"""One thin click module per ``flatpack bench`` command: parse the options, call the benchmark's library,
turn its typed result into JSON or a rich table (the consoles of :mod:`serving.console`). Commands print;
libraries never do. ``bench/cli.py`` maps each command name to its module here."""

__all__: list[str] = []
