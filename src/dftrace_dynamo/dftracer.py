"""DFTracer-compatible namespace: code written for pydftracer's
``from dftracer.python import dftracer`` works with
``from dftrace_dynamo import dftracer``.
"""

from .session.logger import Logger, finalize, get_time, initialize_log, log_event, region

__all__ = ["Logger", "finalize", "get_time", "initialize_log", "log_event", "region"]
