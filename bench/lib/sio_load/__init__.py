"""The parts of ``redis_bench.py``: load-generator processes of python-socketio clients
(``child``), this process's side of them and the phases (``phases``), and the report."""

EVENT = "bench"
CONFIGS = ("memory", "redis", "redis-x2")
