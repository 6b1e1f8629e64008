"""The parts of ``attack_bench.py``: its gateway, the honest listener, the attacks (each run in a
child process: ``attack_bench.py --attacker KIND --spec JSON``) and the report of every window."""

VERSION = "v1"  # the embedded default's outbound version
INBOUND = "/v1/messages"  # and its inbound
EVENT = "probe"
HONEST = "HONEST/1"
ATTACKS = (
    "frames",
    "binary",
    "binary-token",
    "holders",
    "queries",
    "flywheel-flood",
    "flywheel-publish",
    "recovery",
    "replay",
    "filters",
    "sse-slow",
    "auth-brute",
)
NOBODY = "NOBODY/1"  # an id no listener has: the audience of what no socket may receive
HISTORY_TOPIC = "/chat/big"  # kept: the gateway's [[history]] keeps /chat/#
TARGET_STALL_MS, TARGET_RSS_MB, TARGET_LOG_BYTES = 250.0, 64.0, 1 << 20
HUGE_COUNT = 9_999_999_999
BINARY_HEADER = f'45{HUGE_COUNT}-["authenticate",{{"_placeholder":true,"num":0}}]'
HOLDER_KINDS = ("engineio-only", "40-then-41", "refused-no-v")
MB = 1024 * 1024
STILL_OPEN = "still open at the end of the hold"
