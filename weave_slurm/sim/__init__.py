"""weave_slurm.sim: trace-driven simulation.

- ``traces``: the neutral record types (``TraceJob``, ``Trace``, ``TraceEvent``).
- ``loader``: ``load_trace`` / ``save_trace`` (format detection, filling profiles and SLOs).
- ``reference_traces``, ``toml_traces``: the reference line formats and our TOML format.
- ``profiles``, ``slo``: per-kind phase times, synthetic profiles, SLO distributions.
- ``generate``: synthetic traces shaped like the paper's production mix.
- ``events``: the discrete-event core (virtual or wall clock).
- ``accounting``: cost integration and the reference accounting pieces.
- ``replay`` (+ ``outcome``): the trace replay; ``policies``: how it drives placement.
- ``execution``: phase-level execution of one group (invariants, migration, Gantt).
- ``failures``, ``drift``: injected node failures and drifting phase times.
- ``report``, ``plots``: the figures `weave simulate` prints, writes and draws.

See docs/traces.md and docs/simulator.md.
"""
