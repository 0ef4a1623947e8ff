"""Shared pytest fixtures: the Warp devices every test runs on."""

import os

import pytest
import warp as wp

wp.config.quiet = True
wp.init()


def _devices():
    """`cpu` and, when present, `cuda:0`; or the comma-separated list in
    WARPRASTER_TEST_DEVICES (e.g. `cuda:0` on a GPU machine without Warp's CPU compiler)."""
    chosen = os.environ.get("WARPRASTER_TEST_DEVICES")
    if chosen:
        return [d.strip() for d in chosen.split(",") if d.strip()]
    devs = ["cpu"]
    if wp.is_cuda_available():
        devs.append("cuda:0")
    return devs


DEVICES = _devices()


@pytest.fixture(params=DEVICES)
def device(request):
    """Each Warp device present: `cpu` always, `cuda:0` when a GPU is there."""
    return request.param


@pytest.fixture
def cli_device():
    """The first test device, for commands run in a subprocess (one device is enough there)."""
    return DEVICES[0]
