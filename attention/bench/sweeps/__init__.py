"""The benchmark's sweeps, one file each, reading top to bottom: config -> cases -> `Row` -> run -> tables/charts.

`Sweep` is the contract every file here keeps, written once. A sweep never imports another: they share
`attention.bench.core` (envelope, `measure`, failure path, yardsticks, memory budget), `results` (the schema's
rules), `format` and `metrics`. Adding one is a file here and its line in `attention.bench.SWEEPS`: it then runs
as `--profile <NAME>`, validates, and shows on the Benchmarks page where `<!-- runs: <NAME> -->` stands.
"""

from typing import Protocol, runtime_checkable


@runtime_checkable
class Sweep(Protocol):
    """One measurement of the benchmark: a module with these names.

    * `NAME`: its key in `SWEEPS`, and its section of a results file: `result[NAME]` (the sequence sweep's is
      the file's top level, where it has always been).
    * `Config`: a dataclass of what it measures, every field with a default; a profile (`profiles.PROFILES`)
      overrides some, and so do command-line options of the same name (or renamed by `Config.OPTIONS`,
      `{option: field}`). `config.resolve(device)` returns a copy with the device's defaults filled in, and
      raises `ValueError` naming any bad value, before anything is measured.
    * `Row`: a `TypedDict` of one row that includes `core.Measured`; every field is `Annotated[type, rule,
      description]` (the rules of `attention.bench.results`), so one definition validates the rows and writes
      the schema page's table.
    * `run(config, envelope)`: measures into `envelope.open(NAME, header, rows)` (the config record, and the
      number of rows to come), one row at a time through `core.measure` and `envelope.add`.
    * `validate(section, result) -> list[str]`: the section against its rules, then what rules cannot see,
      each derived number recomputed from the row's own; every problem a sentence naming the field.
    * `tables(result) -> str`: Markdown, what the command line prints after a run.
    * `charts(result) -> {kind: (Figure, alt text)}`: matplotlib figures, drawn without pyplot.
    * `page(result, images) -> str`: the Benchmarks page's Markdown for one run (`images`: kind -> the
      Markdown image of that chart).
    """

    NAME: str
    Config: type
    Row: type

    def run(self, config, envelope) -> None: ...

    def validate(self, section: dict, result: dict) -> list: ...

    def tables(self, result: dict) -> str: ...

    def charts(self, result: dict) -> dict: ...

    def page(self, result: dict, images: dict) -> str: ...
