"""The round exchange on the clouds' side: every cloud reduces every round for itself (replicated outer step).

Each cloud commits its pseudo-gradient to its own store; the clouds agree on who
is in a round through one write-once record in the run's home store
(``members``); then each cloud downloads every member's delta once, screens it,
reduces tensor by tensor in bounded fragments and applies the outer step
(``reduce``), commits its own copy of the new global with a digest (``cloud``).
Nothing but the files of the round is held whole: see docs/exchange.md.
"""
