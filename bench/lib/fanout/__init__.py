"""The parts of ``fanout_bench.py``: its phases, one L's run (connect, phases, disconnect) and the
report; the lean clients are ``lib/lean``'s."""
