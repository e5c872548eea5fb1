"""harness.params: one declaration gives the checks (messages naming key and value), the JSON schema and
the command-line options."""
from __future__ import annotations

import argparse
from typing import Literal

import jsonschema
import pytest
from pydantic import model_validator

from harness import params
from harness.params import Field, Params


class Inner(Params):
    steps: int = Field(3, ge=1, le=10, description="how many")


class Toy(Params):
    lr: float = Field(0.1, gt=0, description="step size")
    rank: int | None = Field(None, ge=1)
    mode: Literal["a", "b"] = "a"
    on: bool = False
    fraction: float = Field(0.5, ge=0, lt=1)
    name: str = Field(min_length=1)
    sizes: list[int] = Field(default_factory=lambda: [1, 2])
    inner: Inner = Field(default_factory=Inner)

    @model_validator(mode="after")
    def _relation(self):
        if self.mode == "b" and self.rank is None:
            raise ValueError("method 'toy': mode 'b' needs a rank")
        return self


def parse(**given):
    return params.parse(Toy, {"name": "x", **given}, owner="method 'toy': ")


@pytest.mark.parametrize("given, message", [
    ({"lr": -1}, "method 'toy': parameter 'lr' must be a number > 0, got -1"),
    ({"lr": True}, "parameter 'lr' must be a number > 0, got True"),
    ({"lr": float("nan")}, "parameter 'lr' must be a number > 0, got nan"),
    ({"rank": 0}, "parameter 'rank' must be an integer >= 1 or null, got 0"),
    ({"rank": 2.0}, "parameter 'rank' must be an integer >= 1 or null, got 2.0"),
    ({"mode": "c"}, "parameter 'mode' must be one of ['a', 'b'], got 'c'"),
    ({"on": 1}, "parameter 'on' must be true or false, got 1"),
    ({"fraction": 1.0}, "parameter 'fraction' must be a number in [0, 1), got 1.0"),
    ({"name": ""}, "parameter 'name' must be a non-empty string, got ''"),
    ({"sizes": [1, 2.5]}, "parameter 'sizes' must be a list of values each an integer, got [1, 2.5]"),
    ({"inner": {"steps": 11}}, "parameter 'inner.steps' must be an integer in [1, 10], got 11"),
    ({"inner": {"step": 1}}, "method 'toy': unknown parameter 'inner.step'; allowed: ['steps']"),
    ({"colour": 1}, "method 'toy': unknown parameter 'colour'; allowed: ['fraction', 'inner', 'lr', "),
    ({"mode": "b"}, "method 'toy': mode 'b' needs a rank"),
])
def test_a_bad_value_is_named_with_its_key(given, message):
    with pytest.raises(ValueError) as info:
        parse(**given)
    assert str(info.value).startswith(message) or message in str(info.value), str(info.value)


def test_defaults_are_filled_and_an_int_for_a_number_is_a_float():
    toy = parse(lr=1)
    assert toy.as_dict() == {"lr": 1.0, "rank": None, "mode": "a", "on": False, "fraction": 0.5, "name": "x",
                             "sizes": [1, 2], "inner": {"steps": 3}}
    assert isinstance(toy.lr, float)
    with pytest.raises(ValueError, match="missing the parameter 'name'"):
        params.parse(Toy, {})
    with pytest.raises(ValueError, match="parameters must be a mapping of names to values, got"):
        params.parse(Toy, [1])


def test_the_schema_is_the_declaration():
    schema = params.model_schema(Toy)
    assert schema["properties"]["lr"] == {"type": "number", "exclusiveMinimum": 0, "default": 0.1,
                                          "description": "step size"}
    assert schema["properties"]["rank"] == {"type": ["integer", "null"], "minimum": 1, "default": None}
    assert schema["properties"]["mode"] == {"enum": ["a", "b"], "default": "a"}
    assert schema["properties"]["inner"]["properties"]["steps"]["maximum"] == 10
    assert schema["required"] == ["name"] and schema["additionalProperties"] is False
    validator = jsonschema.Draft202012Validator(schema)
    good = {"name": "x", "lr": 2, "rank": None, "inner": {"steps": 10}}
    assert validator.is_valid(good) and parse(**good)  # what one accepts, so does the other
    for bad in ({"lr": 0}, {"rank": 0}, {"mode": "c"}, {"inner": {"steps": 11}}, {"fraction": 1}, {"x": 1}):
        assert not validator.is_valid({"name": "x", **bad}), bad
        with pytest.raises(ValueError):
            parse(**bad)


def test_the_options_are_the_declaration():
    parser = argparse.ArgumentParser()
    params.add_options(parser, Toy, prefix="toy.", aliases={"lr": "--learning-rate"})
    args = parser.parse_args(["--learning-rate", "2", "--mode", "b", "--on", "--rank", "4", "--name", "y"])
    assert params.given_options(args, Toy, prefix="toy.") == {"lr": 2.0, "mode": "b", "on": True, "rank": 4,
                                                              "name": "y"}
    assert params.given_options(parser.parse_args([]), Toy, prefix="toy.") == {}
    assert parser.parse_args(["--no-on"]).__dict__["toy.on"] is False
    with pytest.raises(SystemExit):
        parser.parse_args(["--mode", "c"])
    assert "step size (default 0.1)" in parser.format_help()
    assert "--sizes" not in parser.format_help()  # a list is no plain option


def test_a_title_names_a_pattern_in_words():
    class Named(Params):
        name: str | None = Field(None, pattern="^[a-z]+$", title="lower-case letters")

    with pytest.raises(ValueError, match=r"^parameter 'name' must be lower-case letters or null, got 'A'$"):
        params.parse(Named, {"name": "A"})
    assert params.model_schema(Named)["properties"]["name"]["title"] == "lower-case letters"


def test_read_only_params_refuse_every_change():
    ro = params.ReadOnlyDict({"a": 1})
    for change in (lambda: ro.__setitem__("a", 2), lambda: ro.pop("a"), lambda: ro.update(a=2),
                   lambda: ro.clear(), lambda: ro.setdefault("b", 1), lambda: ro.popitem(),
                   lambda: ro.__delitem__("a")):
        with pytest.raises(TypeError):
            change()
    assert ro == {"a": 1}
