"""The federation's one queue: every way of starting work enters it, and one scheduling pass at a time decides.

``entry`` is what a queued run asks for, ``order`` ranks entries (priority,
fair share, age), ``decide`` is one entry's verdict over the sites as the pass
sees them, ``passes`` is the pass itself (pure: the clock is an argument) and
``service`` binds it to the ledger for the DAGs, the CLI and ``run_job``.
The benchmarks drive ``passes`` with a simulated clock.
"""
