"""The parts of ``history_bench.py`` (retained messages, replays, Redis memory) and what they use:
the subscriber, the posters, Redis's own figures; ``instructions_bench.py`` uses the first two."""
