"""Hook installation on the installed megatron-core: clean install/uninstall, version and feature checks."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest

pytest.importorskip("megatron.core")

from megatron.core.pipeline_parallel import schedules
from megatron.core.transformer.enums import CudaGraphScope

from perseus.errors import PerseusError
import perseus.runtime
from perseus.runtime.job import RecordingListener
from perseus_megatron import compat, hooks
from perseus_megatron.compat import (
    HOOK_POINTS,
    MegatronVersionError,
    UnsupportedMegatronFeature,
    check_step_supported,
    load_schedules_module,
)
from perseus_megatron.hooks import HooksAlreadyInstalled, install_hooks
from megatron_fixtures import no_leftover_hooks  # noqa: F401 - pytest fixtures, found by their names


def test_install_wraps_every_hook_point_and_uninstall_restores_the_originals():
    originals = {p: getattr(schedules, p) for p in HOOK_POINTS}
    handle = install_hooks(RecordingListener())
    for point in HOOK_POINTS:
        current = getattr(schedules, point)
        assert current is not originals[point] and hooks.is_hooked(current, point)
        assert current.__wrapped__ is originals[point]
    assert not handle.patched_source
    handle.uninstall()
    handle.uninstall()  # idempotent
    assert {p: getattr(schedules, p) for p in HOOK_POINTS} == originals
    assert hooks.active_handle() is None


def test_context_manager_uninstalls():
    original = schedules.forward_step
    with install_hooks(RecordingListener()):
        assert schedules.forward_step is not original
    assert schedules.forward_step is original


def test_a_second_install_is_rejected_until_the_first_is_removed():
    first = install_hooks(RecordingListener())
    with pytest.raises(HooksAlreadyInstalled, match="already installed"):
        install_hooks(RecordingListener())
    assert HooksAlreadyInstalled is perseus.runtime.HooksAlreadyInstalled, "one class for every adapter"
    first.uninstall()
    install_hooks(RecordingListener()).uninstall()


def test_install_needs_a_listener():
    with pytest.raises(PerseusError, match="not an InstructionListener"):
        install_hooks(object())  # type: ignore[arg-type]  # the wrong type is what this test passes
    with pytest.raises(PerseusError, match="exactly one"):
        install_hooks()
    with pytest.raises(PerseusError, match="exactly one"):
        install_hooks(RecordingListener(), listener_for_step=lambda info: RecordingListener())


def test_missing_hook_point_names_version_and_what_is_missing(monkeypatch):
    import megatron.core

    monkeypatch.setattr(megatron.core, "__version__", "0.99.0")
    monkeypatch.delattr(schedules, "backward_step")
    with pytest.raises(MegatronVersionError) as err:
        install_hooks(RecordingListener())
    message = str(err.value)
    assert "0.99.0" in message and "schedules.backward_step" in message and compat.TESTED_VERSIONS in message
    assert hooks.active_handle() is None


def test_changed_signature_is_reported_as_missing_parameter(monkeypatch):
    def forward_step(forward_step_func, data_iterator, model):  # an older signature
        raise AssertionError("never called")

    monkeypatch.setattr(schedules, "forward_step", forward_step)
    with pytest.raises(MegatronVersionError, match="current_microbatch, vp_stage of schedules.forward_step"):
        load_schedules_module()


@pytest.mark.parametrize("version", ["0.15.3", "0.20.0rc0"])
def test_unsupported_version_with_all_hook_points_warns(monkeypatch, version):
    import megatron.core

    monkeypatch.setattr(megatron.core, "__version__", version)
    with pytest.warns(UserWarning, match=f"{version} .* outside the supported releases"):
        load_schedules_module()


@pytest.mark.parametrize("version", ["0.16.1", "0.17.0", "0.18.2", "0.19.2"])
def test_supported_versions_install_without_warning(monkeypatch, version):
    import megatron.core

    monkeypatch.setattr(megatron.core, "__version__", version)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_schedules_module()


def test_backward_step_without_model_type_is_accepted(monkeypatch):
    """core 0.17 dropped model_type from backward_step; the wrapper never used it."""
    original = schedules.backward_step

    def backward_step(input_tensor, output_tensor, output_tensor_grad, config):
        raise AssertionError("never called")

    monkeypatch.setattr(schedules, "backward_step", backward_step)
    assert compat.missing_hook_points(schedules) == []
    handle = install_hooks(RecordingListener())
    try:
        assert hooks.is_hooked(schedules.backward_step, "backward_step")
    finally:
        handle.uninstall()
    assert schedules.backward_step is backward_step
    monkeypatch.setattr(schedules, "backward_step", original)


def test_backward_step_output_tensor_must_be_second(monkeypatch):
    def backward_step(output_tensor, input_tensor, output_tensor_grad, config):
        raise AssertionError("never called")

    monkeypatch.setattr(schedules, "backward_step", backward_step)
    with pytest.raises(MegatronVersionError, match="output_tensor of schedules.backward_step at position 2"):
        load_schedules_module()


@pytest.mark.parametrize(
    "config, match",
    [
        (SimpleNamespace(hybrid_context_parallel=True), "hybrid_context_parallel"),
        (SimpleNamespace(cuda_graph_impl="local", cuda_graph_scope=[CudaGraphScope.full_iteration]), "full-iteration"),
    ],
)
def test_unobservable_features_are_refused_for_training_steps(config, match):
    with pytest.raises(UnsupportedMegatronFeature, match=match):
        check_step_supported(config, forward_only=False)
    check_step_supported(config, forward_only=True)  # evaluation is not reported, so it may use them


def test_per_layer_cuda_graphs_and_plain_configs_are_fine():
    check_step_supported(SimpleNamespace(cuda_graph_impl="local", cuda_graph_scope=[CudaGraphScope.attn]), False)
    check_step_supported(SimpleNamespace(cuda_graph_impl="transformer_engine", cuda_graph_scope=[]), False)
    check_step_supported(SimpleNamespace(), False)


def test_multi_module_pipelines_are_refused():
    class MultiModuleProcessGroupCollection:  # core 0.19's bridge schedule collection, by name
        pass

    with pytest.raises(UnsupportedMegatronFeature, match="multi-module"):
        compat.check_call_supported({"pg_collection": MultiModuleProcessGroupCollection()})
    compat.check_call_supported({"pg_collection": SimpleNamespace()})
    compat.check_call_supported({})
