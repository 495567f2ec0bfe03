"""Client settings for Kafka, in one place.

Tansu (the embedded broker) lets a consumer group join only after the rebalance timeout, and a member
left behind by a killed process holds the next join for its session timeout. Short timeouts keep joins
at a second or two; they are fine on a real cluster too, for these small, fast consumers.
"""

GROUP_TIMEOUTS_MS = {
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 1000,
    "max_poll_interval_ms": 10000,
}

# Faust's names for the same timeouts, in seconds.
FAUST_GROUP_TIMEOUTS_S = {
    "broker_session_timeout": 6.0,
    "broker_heartbeat_interval": 1.0,
    "broker_max_poll_interval": 10.0,
    "broker_rebalance_timeout": 10.0,
}

# Longest a fetch waits at the broker for data. Tansu holds an empty fetch for the whole wait even when
# data arrives meanwhile, so kafka-python's default (500 ms) adds up to half a second to every hop.
FETCH_MAX_WAIT_MS = 50
