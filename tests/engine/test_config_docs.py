"""Every config key documents itself: a one-line doc beside each field, and ``easyr1 config --explain
KEY`` printing it with the key's type, default, and EasyR1's default where it differs."""

from __future__ import annotations

import dataclasses

import pytest

from easyr1.cli import main
from easyr1.config import ConfigError, PPOConfig
from easyr1.config_docs import EASYR1_DEFAULTS, NOT_IN_EASYR1, config_classes, explain, field_docs


def _value(dotted: str) -> object:
    value: object = PPOConfig()
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def test_every_field_of_every_config_class_has_a_one_line_doc() -> None:
    classes = list(config_classes())
    assert len(classes) == 15  # PPOConfig and the 14 section classes it composes
    missing = [
        f"{cls.__module__}.{cls.__name__}.{f.name}"
        for cls in classes
        for f in dataclasses.fields(cls)
        if not field_docs(cls).get(f.name, "").strip()
    ]
    assert not missing, f"fields without a doc string after them: {missing}"


def test_a_field_without_a_doc_is_found() -> None:
    @dataclasses.dataclass
    class Section:
        documented: int = 1
        """What it is."""
        bare: int = 2

    assert field_docs(Section) == {"documented": "What it is."}


def test_explain_a_key() -> None:
    text = explain("worker.actor.optim.lr")
    assert (
        text.splitlines()[0]
        == f"worker.actor.optim.lr: {field_docs(type(PPOConfig().worker.actor.optim))['lr']}"
    )
    assert "  type: a number" in text and "  default: 1.0e-06" in text
    assert "EasyR1" not in text  # the same default as EasyR1's


def test_explain_says_where_easyr1_differs() -> None:
    text = explain("worker.rollout.name")
    assert (
        "  type: one of auto, hf, vllm" in text
        and "  default: auto" in text
        and "  EasyR1's default: vllm" in text
    )
    assert "EasyR1: not a key of its schema" in explain("trainer.stall_report_s")


def test_explain_a_nested_section_lists_its_keys() -> None:
    text = explain("worker.actor.model.lora")
    assert text.startswith("worker.actor.model.lora: ")
    assert "  worker.actor.model.lora.rank: LoRA's rank" in text


@pytest.mark.parametrize(
    ("key", "named"),
    [
        (
            "worker.actor.optim.lrr",
            "unknown config key 'worker.actor.optim.lrr'; did you mean worker.actor.optim.lr?",
        ),
        ("trainer.bogus", "unknown config key 'trainer.bogus'"),
        ("data.seed.x", "data.seed is a key, not a section"),
        ("worker.reward.score_function", "EasyR1 renamed it worker.reward.reward_function"),
    ],
)
def test_explain_an_unknown_key_names_it(key: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace("?", r"\?").replace(".", r"\.")):
        explain(key)


def test_easyr1_config_explain(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "--explain", "data.max_prompt_length"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("data.max_prompt_length: ") and "  default: 512" in out
    assert main(["config", "--explain", "data.max_promt_length"]) == 2
    assert (
        "unknown config key 'data.max_promt_length'; did you mean data.max_prompt_length?"
        in capsys.readouterr().err
    )
    assert main(["config", "--explain"]) == 2
    assert "usage: easyr1 config --explain KEY" in capsys.readouterr().err


def test_easyr1_tables_name_schema_keys() -> None:
    for key, theirs in EASYR1_DEFAULTS.items():
        assert _value(key) != theirs, f"{key}: the same default as EasyR1's, so not a difference"
    for key in [*EASYR1_DEFAULTS, *NOT_IN_EASYR1]:
        explain(key)  # a key of the schema
