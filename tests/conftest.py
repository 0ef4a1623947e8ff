"""Shared pytest fixtures: the Warp devices every test runs on."""

import pytest
import warp as wp

wp.config.quiet = True
wp.init()


def _devices():
    devs = ["cpu"]
    if wp.is_cuda_available():
        devs.append("cuda:0")
    return devs


DEVICES = _devices()


@pytest.fixture(params=DEVICES)
def device(request):
    """Each Warp device present: `cpu` always, `cuda:0` when a GPU is there."""
    return request.param
