"""Which megatron-core releases the hooks accept, decided on the real ``schedules.py`` of each archive.

``compat.missing_hook_points_in_source`` is the same check ``install_hooks`` runs on the imported
module, applied to the file's text, so releases that need Python 3.12 are checked here on 3.11
without torch.
"""

from __future__ import annotations

import pytest

from megatron_lm_archive import RELEASES, read_member
from perseus_megatron import compat

SCHEDULES = "megatron/core/pipeline_parallel/schedules.py"


@pytest.mark.parametrize("version", sorted(RELEASES))
def test_release_schedules_have_every_hook_point(version):
    source = read_member(version, SCHEDULES)
    assert compat.missing_hook_points_in_source(source) == []
    assert compat.is_supported_version(version)


def test_backward_step_model_type_is_gone_from_019_and_not_needed():
    old = read_member("0.16.1", SCHEDULES)
    new = read_member("0.19.0", SCHEDULES)
    assert "def backward_step(input_tensor, output_tensor, output_tensor_grad, model_type, config):" in old
    assert "def backward_step(input_tensor, output_tensor, output_tensor_grad, config):" in new


def test_source_check_names_what_moved():
    source = read_member("0.19.0", SCHEDULES).replace(
        "def backward_step(input_tensor, output_tensor, output_tensor_grad, config):",
        "def backward_step(input_tensor, output_tensor_grad, config, output_tensor=None):",
    ).replace("current_microbatch=None,", "microbatch=None,", 1)
    missing = compat.missing_hook_points_in_source(source)
    assert "parameter(s) current_microbatch of schedules.forward_step" in missing
    assert any("output_tensor of schedules.backward_step at position 2" in m for m in missing)
    assert "function schedules.backward_step" in compat.missing_hook_points_in_source("def forward_step(): pass\n")


@pytest.mark.parametrize("version, supported", [("0.16.1", True), ("0.17.0", True), ("0.19.2", True),
                                                ("0.15.3", False), ("0.20.0", False), ("main", False)])
def test_supported_release_lines(version, supported):
    assert compat.is_supported_version(version) is supported


@pytest.mark.parametrize("version, generation", [("0.16.1", "extra_args_provider"), ("0.19.0", "parse_and_validate_args")])
def test_launcher_hook_point_exists_in_both_pretrain_gpt_generations(version, generation):
    """The launcher wraps arguments.add_megatron_arguments, which parse_args looks up at call time."""
    import ast

    arguments = read_member(version, "megatron/training/arguments.py")
    tree = ast.parse(arguments)
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    calls = {c.func.id for c in ast.walk(functions["parse_args"]) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
    assert "add_megatron_arguments" in calls and "add_megatron_arguments" in functions
    main = read_member(version, "pretrain_gpt.py").split('if __name__ == "__main__":', 1)[1]
    if generation == "extra_args_provider":
        assert "extra_args_provider=" in main and "parse_and_validate_args" not in main
    else:
        assert "parse_and_validate_args(" in main and "pretrain(\n        full_config," in main
        assert "parse_and_validate_args" in functions
