"""The default ``cache_dir`` is absolute and the same from every working directory: every rank and
every launcher (torchrun, deepspeed, a Slurm step, a restarted pod) finds the profiles and frontiers
that an earlier run cached. ``$PERSEUS_CACHE_DIR`` chooses it; otherwise the user's cache directory."""

from __future__ import annotations

import argparse
import os

import pytest

from perseus.runtime.config import PerseusConfig, default_cache_dir


@pytest.fixture
def env(monkeypatch, tmp_path):
    monkeypatch.delenv("PERSEUS_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return monkeypatch


def test_the_default_is_the_users_cache_directory(env, tmp_path):
    assert PerseusConfig().cache_dir == str(tmp_path / "home" / ".cache" / "perseus")


def test_the_default_does_not_depend_on_the_working_directory(env, tmp_path):
    first = PerseusConfig().cache_dir
    (tmp_path / "elsewhere").mkdir()
    env.chdir(tmp_path / "elsewhere")
    assert PerseusConfig().cache_dir == first and os.path.isabs(first)


def test_xdg_cache_home_is_honoured_when_absolute(env, tmp_path):
    env.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert PerseusConfig().cache_dir == str(tmp_path / "xdg" / "perseus")
    env.setenv("XDG_CACHE_HOME", "relative/cache")  # the XDG spec: a relative path is ignored
    assert PerseusConfig().cache_dir == str(tmp_path / "home" / ".cache" / "perseus")


def test_perseus_cache_dir_wins_and_is_made_absolute(env, tmp_path):
    env.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    env.setenv("PERSEUS_CACHE_DIR", "/ckpt/perseus")
    assert default_cache_dir() == "/ckpt/perseus" == PerseusConfig().cache_dir
    env.setenv("PERSEUS_CACHE_DIR", "~/shared/perseus")
    assert PerseusConfig().cache_dir == str(tmp_path / "home" / "shared" / "perseus")
    env.chdir(tmp_path)
    env.setenv("PERSEUS_CACHE_DIR", "rel")
    assert PerseusConfig().cache_dir == str(tmp_path / "rel")


def test_a_configured_directory_is_kept_with_its_tilde_expanded_and_null_turns_the_cache_off(env, tmp_path):
    assert PerseusConfig.from_dict({"cache_dir": "/data/p"}).cache_dir == "/data/p"
    assert PerseusConfig.from_dict({"cache_dir": "~/p"}).cache_dir == str(tmp_path / "home" / "p")
    assert PerseusConfig.from_dict({"cache_dir": None}).cache_dir is None


def test_megatron_and_deepspeed_users_get_the_same_default(env, tmp_path):
    from perseus_megatron.args import add_perseus_args, config_from_args

    env.setenv("PERSEUS_CACHE_DIR", str(tmp_path / "c"))
    args = add_perseus_args(argparse.ArgumentParser(allow_abbrev=False)).parse_args(["--perseus"])
    assert config_from_args(args).cache_dir == str(tmp_path / "c")
    assert PerseusConfig.from_dict({"mode": "run"}).cache_dir == str(tmp_path / "c")  # a "perseus" section
