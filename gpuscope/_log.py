"""gpuscope's logger and a log-once helper for errors raised inside the training process."""

import logging

logger = logging.getLogger("gpuscope")
_seen: set = set()


def warn_once(key: str, msg: str, *args, exc_info=False) -> None:
    """Log `msg` at WARNING the first time `key` is seen in this process, then stay quiet."""
    if key in _seen:
        return
    _seen.add(key)
    logger.warning(msg, *args, exc_info=exc_info)


def info_once(key: str, msg: str, *args) -> None:
    """Log `msg` at INFO the first time `key` is seen in this process."""
    if key in _seen:
        return
    _seen.add(key)
    logger.info(msg, *args)
