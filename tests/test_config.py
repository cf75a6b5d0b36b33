"""Parsing of every DFTRACER_* variable (pure, no process needed)."""

import logging

import pytest

from dftrace_dynamo.session import config


def test_defaults_match_dftracer():
    cfg = config.load({})
    assert cfg.enable is None and cfg.error is None
    assert cfg.log_file == "./trace" and not cfg.log_file_from_env
    assert cfg.compression == config.COMPRESSION_GZIP
    assert cfg.write_buffer_size == 16 * 1024 * 1024
    assert not cfg.inc_metadata and not cfg.bind_signals
    assert cfg.log_level == logging.WARNING


@pytest.mark.parametrize("raw, expected", [("1", config.COMPRESSION_GZIP), ("gzip", config.COMPRESSION_GZIP),
                                           ("GZIP", config.COMPRESSION_GZIP), ("0", config.COMPRESSION_NONE),
                                           ("zstd", config.COMPRESSION_ZSTD), ("2", config.COMPRESSION_ZSTD),
                                           ("gzip-general", config.COMPRESSION_GZIP_GENERAL)])
def test_compression_values(raw, expected):
    assert config.load({"DFTRACER_TRACE_COMPRESSION": raw}).compression == expected


@pytest.mark.parametrize("raw, expected", [("65536", 65536), ("4M", 4 << 20), ("2mib", 2 << 20), ("1G", 1 << 30)])
def test_buffer_sizes(raw, expected):
    assert config.load({"DFTRACER_WRITE_BUFFER_SIZE": raw}).write_buffer_size == expected


def test_enable_and_compat_variables():
    cfg = config.load({"DFTRACER_ENABLE": "1", "DFTRACER_LOG_FILE": "/x/y", "DFTRACER_INC_METADATA": "1",
                       "DFTRACER_DATA_DIR": "/a:/b", "DFTRACER_DISABLE_IO": "1", "DFTRACER_INIT": "preload",
                       "DFTRACER_LOG_LEVEL": "debug", "DFTRACER_BIND_SIGNALS": "1"})
    assert cfg.enable is True and cfg.log_file == "/x/y" and cfg.log_file_from_env
    assert cfg.inc_metadata and cfg.bind_signals and cfg.disable_io
    assert cfg.data_dirs == ("/a", "/b") and cfg.init == "PRELOAD" and cfg.log_level == logging.DEBUG
    assert config.load({"DFTRACER_ENABLE": "0"}).enable is False


@pytest.mark.parametrize("name, raw", [
    ("DFTRACER_ENABLE", "yes"), ("DFTRACER_ENABLE", "true"), ("DFTRACER_WRITE_BUFFER_SIZE", "-5"),
    ("DFTRACER_WRITE_BUFFER_SIZE", "12"), ("DFTRACER_WRITE_BUFFER_SIZE", "lots"),
    ("DFTRACER_TRACE_COMPRESSION", "lz4"), ("DFTRACER_INC_METADATA", "on"), ("DFTRACER_INIT", "EARLY"),
    ("DFTRACER_LOG_LEVEL", "TRACE"), ("DFTRACER_CUDA_EVENTS", "y"), ("DFTRACER_TRACE_COMPRESSION", "3"),
    ("DFTRACER_WRITE_BUFFER_SIZE", "\u00b2"), ("DFTRACER_WRITE_BUFFER_SIZE", "64\u00b2"),
])
def test_bad_values_disable_tracing_and_name_the_variable(name, raw):
    cfg = config.load({name: raw, "DFTRACER_ENABLE": "1"} if name != "DFTRACER_ENABLE" else {name: raw})
    assert cfg.enable is False
    assert cfg.error.startswith(f"{name}={raw!r}") and "accepted" in cfg.error


def test_buffer_size_beyond_the_machine_is_capped():
    cfg = config.load({"DFTRACER_WRITE_BUFFER_SIZE": "99999999999999999999"})
    assert cfg.error is None and cfg.write_buffer_size == config.max_buffer_size()
    assert "is more than this machine can hold" in cfg.warning
