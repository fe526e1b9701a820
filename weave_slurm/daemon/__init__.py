"""weaved, the meta-scheduler daemon: SQLite store, state machines, reconcile loop, socket API.

Runs on the login (or a service) node. Modules: ``states`` (enums + the one transition
table), ``store`` (SQLite, write-ahead intents), ``records`` (the stored rows),
``driver`` (the seam to what runs in the allocations), ``group_runtime`` (the RL
driver: one group runner per group), ``runtime_view`` (what status shows of a member),
``reconcile`` (the loop), ``protocol`` / ``server`` / ``client`` (the Unix-socket API),
``service`` (the daemon's life cycle).
"""
