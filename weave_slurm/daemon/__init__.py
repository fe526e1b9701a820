"""weaved, the meta-scheduler daemon: SQLite store, state machines, reconcile loop, socket API.

Modules: ``states`` (enums + the one transition table), ``store`` (SQLite, write-ahead
intents), ``records`` (the stored rows), ``world`` (what Slurm shows), ``executor``
(the seam for the group runtime), ``reconcile`` (the loop), ``protocol`` / ``server``
/ ``client`` (the Unix-socket API), ``service`` (the daemon's life cycle).
"""
