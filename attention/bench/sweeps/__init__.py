"""The benchmark's sweeps, one file each, reading top to bottom: config -> cases -> `Row` -> run -> validate.

`Sweep` is the contract every file here keeps, written once. A sweep never imports another: they share
`attention.bench.core` (envelope, `measure`, failure path, yardsticks, memory budget), `results` (the schema's
rules) and `metrics`. What a run shows (tables, charts, the Benchmarks page's section) is `attention.report`'s,
one module per sweep there. Adding a sweep is a file here, its line in `attention.bench.SWEEPS` and its module in
`attention.report.PAGES`: it then runs as `--profile <NAME>`, validates, and shows where `<!-- runs: <NAME> -->`
stands on the Benchmarks page.
"""

from typing import Protocol, runtime_checkable


@runtime_checkable
class Sweep(Protocol):
    """One measurement of the benchmark: a module with these names.

    * `NAME`: its key in `SWEEPS`, and its section of a results file: `result[NAME]` (the sequence sweep's is
      the file's top level, where it has always been).
    * `KEY`: the row fields that tell one row of the section from another (what `--refresh` replaces).
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

    Optional: `subjects(row)`, the modules a row measured beyond the sweep's own (its class: a row's numbers
    depend on the files these and the sweep's module import, `attention.bench.results.measured_by`);
    `for_rows(config, rows)`, the config narrowed to what measures `rows` again; `finish(section)`, what a section
    derives from all its rows (run after `run`, and after `--refresh` replaced some).
    """

    NAME: str
    KEY: tuple
    Config: type
    Row: type

    def run(self, config, envelope) -> None: ...

    def validate(self, section: dict, result: dict) -> list: ...
