"""The CPU calibration cache serves only the machine it was measured on, for a month."""

from __future__ import annotations

import time
from dataclasses import replace

from unipar.cluster.calibrate import (
    MAX_AGE_S,
    cache_file,
    cached_load,
    machine,
    measured_busy_now_quiet,
    read_cache,
    read_record,
    write_cache,
)
from unipar.cluster.spec import PRESETS, Collectives


def _measurement():
    """A measured device as the CPU calibration writes one: gloo's collectives and
    FSDP's rates per micro-batch and per step (each read back as written)."""
    preset = PRESETS["a100-80g"]
    device = replace(
        preset.device,
        collectives=Collectives.GLOO,
        fsdp_unit_overhead_s=1e-5,
        fsdp_step_overhead_s=1e-3,
        fsdp_tensor_overhead_s=2e-4,
    )
    return device, preset.intra_node


def test_a_measurement_is_read_back_on_the_same_machine(tmp_path):
    about = machine()
    path = cache_file(tmp_path, about)
    write_cache(path, about, *_measurement())
    assert read_cache(path, about) == _measurement()


def test_another_machine_measures_again(tmp_path):
    about = machine()
    write_cache(cache_file(tmp_path, about), about, *_measurement())
    for change in ({"cpu": "another CPU"}, {"cpus": 1024}, {"memory_gib": 1}, {"torch": "9.9"}):
        other = {**about, **change}
        assert cache_file(tmp_path, other) != cache_file(tmp_path, about)
        # Even a record found under the other machine's name is not taken.
        assert read_cache(cache_file(tmp_path, about), other) is None


def test_an_old_measurement_is_taken_again(tmp_path):
    about = machine()
    path = cache_file(tmp_path, about)
    write_cache(path, about, *_measurement())
    assert read_cache(path, about, now=time.time() + MAX_AGE_S - 60) is not None
    assert read_cache(path, about, now=time.time() + MAX_AGE_S + 60) is None


def test_the_machine_names_its_cpu_model():
    about = machine()
    assert about["cpu"] and about["cpus"] and about["torch"]


def test_a_calibration_begun_on_a_busy_machine_is_measured_again_once_quiet(tmp_path):
    """The load a measurement began at is kept with it; one begun above the cores' count
    is measured again when at most half of them are busy, and only then."""
    about = machine()
    path = cache_file(tmp_path, about)
    write_cache(path, about, *_measurement(), load_before=3.5)
    assert cached_load(read_record(path, about)) == 3.5
    assert read_cache(path, about) == _measurement()
    assert measured_busy_now_quiet(3.5, 0.8, cpus=2)
    assert not measured_busy_now_quiet(3.5, 1.5, cpus=2)  # still busy: keep it
    assert not measured_busy_now_quiet(1.9, 0.1, cpus=2)  # begun quiet
    assert not measured_busy_now_quiet(None, 0.1, cpus=2)  # an older cache: no load kept
    write_cache(path, about, *_measurement())
    assert cached_load(read_record(path, about)) is None
