"""The parts of ``stream_vs_pubsub.py``: the carriers compared (pub/sub, a stream, the backplane),
the three measurements of each, and the report."""
