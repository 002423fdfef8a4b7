"""The configuration file and environment of seed 001 §8 / Appendix B: APR_CONFIG,
APR_CACHE, APR_LOG_LEVEL, APR_COLOR; defaults for every command's options, the command
line winning; a bad configuration is exit 2, never a traceback."""

import json
import logging

import numpy as np
import pytest

import aprfast
from aprfast import config
from aprfast.cli import main


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch, tmp_path):
    """No setting leaks in from the machine running the tests."""
    for var in ("APR_CONFIG", "APR_CACHE", "APR_LOG_LEVEL", "APR_COLOR", "NO_COLOR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


@pytest.fixture
def model(tmp_path, rng):
    path = tmp_path / "m.apr"
    aprfast.save_file({"a.weight": (0.03 * rng.standard_normal((8, 64))).astype(np.float32)}, path,
                      metadata={"tokenizer.vocabulary": [f"t{i}" for i in range(40)]}, layout="apr2")
    return path


def write_config(tmp_path, monkeypatch, text, name="config.toml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    monkeypatch.setenv("APR_CONFIG", str(path))
    return path


def test_output_format_json_in_the_config_turns_on_json_for_every_command(tmp_path, monkeypatch, model, capsys):
    write_config(tmp_path, monkeypatch, '[defaults]\noutput_format = "json"\n')  # §11 #71
    assert main(["inspect", str(model)]) == 0
    assert json.loads(capsys.readouterr().out)["layout"] == "apr2"
    assert main(["validate", "--nan-check", str(model)]) == 0
    assert json.loads(capsys.readouterr().out)["passed"] is True


def test_command_section_gives_option_defaults_and_the_command_line_wins(tmp_path, monkeypatch, model, capsys):
    write_config(tmp_path, monkeypatch, "[inspect]\nshow_vocab = true\nmax_tokens_display = 2\n")
    assert main(["inspect", "--json", str(model)]) == 0
    vocab = json.loads(capsys.readouterr().out)["vocab"]
    assert vocab["tokens"] == ["t0", "t1"]  # seed §8's names: show_vocab, max_tokens_display
    assert main(["inspect", "--json", "--max-tokens", "5", str(model)]) == 0
    assert len(json.loads(capsys.readouterr().out)["vocab"]["tokens"]) == 5


def test_default_location_is_read_without_apr_config(tmp_path, model, capsys):
    path = tmp_path / "xdg-config" / "apr" / "config.toml"
    path.parent.mkdir(parents=True)
    path.write_text('[defaults]\noutput_format = "json"\n')
    assert main(["inspect", str(model)]) == 0
    assert json.loads(capsys.readouterr().out)["header"]["magic"] == "APR2"


def test_no_config_file_is_no_configuration(model, capsys):
    assert main(["inspect", str(model)]) == 0
    assert capsys.readouterr().out.startswith(str(model))


@pytest.mark.parametrize("text, message", [
    ("[defaults\n", "not valid TOML"),
    ("[inspect]\nvocab = \"yes\"\n", "must be true or false"),
    ("[inspect]\nmax_tokens = -3\n", "negative"),
    ("[defaults]\noutput_format = \"yaml\"\n", "output_format"),
    ("[defaults]\nlog_level = \"loud\"\n", "log level"),
    ("[defaults]\ncolor = \"purple\"\n", "color"),
    ("json = true\n", "belong in a [defaults]"),
])
def test_bad_configuration_exits_2_with_a_message(tmp_path, monkeypatch, model, capsys, text, message):
    write_config(tmp_path, monkeypatch, text)
    assert main(["inspect", str(model)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and message in err and "Traceback" not in err


def test_apr_config_naming_a_missing_file_exits_2(tmp_path, monkeypatch, model, capsys):
    monkeypatch.setenv("APR_CONFIG", str(tmp_path / "nowhere.toml"))
    assert main(["inspect", str(model)]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_config_not_utf8_and_oversized_are_refused(tmp_path, monkeypatch, model, capsys):
    write_config(tmp_path, monkeypatch, "")
    (tmp_path / "config.toml").write_bytes(b"[defaults]\nx = \"\xff\"\n")
    assert main(["inspect", str(model)]) == 2
    assert "not UTF-8" in capsys.readouterr().err
    (tmp_path / "config.toml").write_bytes(b"#" * (config.MAX_CONFIG_BYTES + 1))
    assert main(["inspect", str(model)]) == 2
    assert "over" in capsys.readouterr().err


def test_unknown_key_in_a_command_section_warns_and_is_ignored(tmp_path, monkeypatch, model, capsys):
    write_config(tmp_path, monkeypatch, "[validate]\nstrict = true\n")  # §8's example key, no such option
    assert main(["validate", "--nan-check", str(model)]) == 0
    err = capsys.readouterr().err
    assert "[validate] strict is not an option of apr validate; ignored" in err


def test_defaults_key_naming_an_option_applies_where_the_option_exists(tmp_path, monkeypatch, model, capsys):
    write_config(tmp_path, monkeypatch, "[defaults]\nthreads = 1\n")
    assert main(["validate", "--nan-check", str(model)]) == 0  # validate has --threads
    assert main(["inspect", str(model)]) == 0  # inspect has none: nothing to apply
    write_config(tmp_path, monkeypatch, "[defaults]\nthreads = \"many\"\n")
    assert main(["validate", str(model)]) == 2


def test_apr_cache_and_the_config_command(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "x" / "cache"
    monkeypatch.setenv("APR_CACHE", str(cache))  # §11 #70
    write_config(tmp_path, monkeypatch, '[defaults]\ncache_dir = "/nonexistent/ignored"\n[debug]\nhex_limit = 64\n')
    assert main(["config", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["cache_dir"] == str(cache) and cache.is_dir()
    assert report["config_file_read"] is True and report["named_by_APR_CONFIG"] is True
    assert report["commands"] == {"debug": {"hex_limit": 64}}
    assert (cache.stat().st_mode & 0o777) == 0o700


def test_cache_dir_from_config_then_default(tmp_path, monkeypatch):
    settings = config.Settings("x.toml", {"defaults": {"cache_dir": str(tmp_path / "c2")}})
    assert config.cache_dir(settings) == tmp_path / "c2"
    assert config.cache_dir(config.Settings()) == tmp_path / "xdg-cache" / "apr"


def test_log_level_from_environment_over_config(monkeypatch):
    settings = config.Settings("x.toml", {"defaults": {"log_level": "error"}})
    assert config.log_level(settings) == logging.ERROR
    monkeypatch.setenv("APR_LOG_LEVEL", "DEBUG")
    assert config.log_level(settings) == logging.DEBUG
    monkeypatch.setenv("APR_LOG_LEVEL", "verbose")
    with pytest.raises(config.ConfigError):
        config.log_level(settings)


def test_apr_log_level_bad_value_exits_2(monkeypatch, model, capsys):
    monkeypatch.setenv("APR_LOG_LEVEL", "chatty")
    assert main(["inspect", str(model)]) == 2
    assert "log level" in capsys.readouterr().err


def test_log_level_routes_aprfast_warnings_to_stderr(tmp_path, monkeypatch, model, capsys):
    logger = logging.getLogger("aprfast.test")
    monkeypatch.setenv("APR_LOG_LEVEL", "error")
    with config.logging_to_stderr(config.log_level()):
        logger.warning("hidden")
        logger.error("shown")
    err = capsys.readouterr().err
    assert "apr: ERROR: shown" in err and "hidden" not in err
    assert not any(isinstance(h, logging.StreamHandler) and h.level == logging.ERROR
                   for h in logging.getLogger("aprfast").handlers)  # removed after the command


def test_color_mode_precedence(monkeypatch):
    settings = config.Settings("x.toml", {"defaults": {"color": False}})
    assert config.color_mode(settings) == "never"
    monkeypatch.setenv("APR_COLOR", "always")
    assert config.color_mode(settings) == "always"
    assert config.color_mode(settings, "never") == "never"  # --color wins


def test_color_enabled(monkeypatch):
    class Tty:
        def isatty(self):
            return True

    assert config.color_enabled("auto", Tty()) is True
    monkeypatch.setenv("NO_COLOR", "1")
    assert config.color_enabled("auto", Tty()) is False
    assert config.color_enabled("always", object()) is True
    assert config.color_enabled("never", Tty()) is False


def test_color_option_and_environment_reach_the_config_command(monkeypatch, capsys):
    monkeypatch.setenv("APR_COLOR", "never")
    assert main(["config", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["color"] == "never"
    assert main(["--color", "always", "config", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["color"] == "always"
    monkeypatch.setenv("APR_COLOR", "sometimes")
    assert main(["config"]) == 2


def test_apr_color_always_colours_validate_and_never_does_not(monkeypatch, model, capsys):
    monkeypatch.setenv("APR_COLOR", "always")
    assert main(["validate", "--nan-check", str(model)]) == 0
    assert "\x1b[32m[PASS]\x1b[0m nan-check" in capsys.readouterr().out
    monkeypatch.setenv("APR_COLOR", "never")
    assert main(["validate", "--nan-check", str(model)]) == 0
    out = capsys.readouterr().out
    assert "[PASS] nan-check" in out and "\x1b[" not in out
