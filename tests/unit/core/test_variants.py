"""The variant registry (testbed_core/variants.py): names are checked against it with
the allowed list in the error, its order is the report order, colours are stable,
and run names with the BubbleTea suffix parse to the same variant."""

from __future__ import annotations

import pytest

from testbed_core.variants import (
    BUBBLETEA_SUFFIX,
    EXTRA_COLOURS,
    REGISTRY,
    RunVariant,
    VariantError,
    base_name,
    colour,
    default_names,
    get_variant,
    has_bubbletea,
    parse_run_variant,
    parse_run_variants,
    parse_variants,
    sort_key,
)

ALLOWED = "allowed: baseline, multi-tcp, atlas, dp-across-dc, torch-gloo"


def test_unknown_names_are_refused_with_the_allowed_list() -> None:
    with pytest.raises(VariantError, match=f"unknown variant 'turbo' \\({ALLOWED}\\)"):
        get_variant("turbo")
    with pytest.raises(VariantError, match=f"unknown variant 'turbo\\+bubbletea' \\({ALLOWED}, each optionally "
                                           "\\+bubbletea\\)"):
        parse_run_variant("turbo+bubbletea")
    with pytest.raises(VariantError, match=f"unknown variant\\(s\\) fast, slow \\({ALLOWED}\\)$"):
        parse_variants(["atlas", "fast", "slow"])
    with pytest.raises(VariantError, match="unknown variant\\(s\\) atlas\\+fast .*each optionally \\+bubbletea"):
        parse_run_variants(["atlas", "atlas+fast"])
    # the suffix alone belongs to runs, not to the variants a plan predicts
    with pytest.raises(VariantError, match="unknown variant\\(s\\) atlas\\+bubbletea"):
        parse_variants(["atlas+bubbletea"])


def test_registry_order_is_the_report_order() -> None:
    assert list(REGISTRY) == ["baseline", "multi-tcp", "atlas", "dp-across-dc", "torch-gloo"]
    assert default_names() == ("baseline", "multi-tcp", "atlas")  # dp-across-dc, torch-gloo only when asked for
    shuffled = ["atlas+bubbletea", "unknown", "dp-across-dc", "atlas", "baseline+bubbletea", "multi-tcp", "baseline"]
    assert sorted(shuffled, key=sort_key) == [
        "baseline", "baseline+bubbletea", "multi-tcp", "atlas", "atlas+bubbletea", "dp-across-dc", "unknown"]
    assert [v.name for v in parse_variants(["atlas", "baseline"])] == ["atlas", "baseline"]  # as given


def test_colours_are_per_variant_and_stable_for_unknown_ones() -> None:
    assert len({v.colour for v in REGISTRY.values()}) == len(REGISTRY)
    assert colour("atlas+bubbletea") == colour("atlas") == REGISTRY["atlas"].colour
    extra: dict[str, str] = {}
    first, second = colour("mine", extra), colour("theirs", extra)
    assert (first, second) == EXTRA_COLOURS[:2]
    assert colour("mine+bubbletea", extra) == first  # remembered, and shared with the BubbleTea twin
    assert not set(EXTRA_COLOURS) & {v.colour for v in REGISTRY.values()}


def test_run_variants_parse_the_bubbletea_suffix() -> None:
    run = parse_run_variant("atlas" + BUBBLETEA_SUFFIX)
    assert run == RunVariant(REGISTRY["atlas"], bubbletea=True)
    assert run.name == "atlas+bubbletea" and run.base == "atlas"  # the summary.json key
    assert parse_run_variant("multi-tcp") == RunVariant(REGISTRY["multi-tcp"])
    assert parse_run_variant("multi-tcp").name == "multi-tcp"
    assert [r.name for r in parse_run_variants(["atlas", "baseline+bubbletea", "atlas"])] == [
        "atlas", "baseline+bubbletea"]  # each once, in the order given
    assert base_name("dp-across-dc+bubbletea") == "dp-across-dc" and base_name("other") == "other"
    assert has_bubbletea("x+bubbletea") and not has_bubbletea("atlas")


def test_policies_set_each_variant_apart() -> None:
    ways = {(v.placement, v.streams, v.sharing, v.comm) for v in REGISTRY.values()}
    assert len(ways) == len(REGISTRY)  # no two variants are the same thing under two names
    assert REGISTRY["atlas"].streams == "fill-link" and REGISTRY["atlas"].sharing == "auto"
    assert REGISTRY["baseline"].streams == "one"
    # torch-gloo is the baseline through torch.distributed: only its comm differs
    assert (REGISTRY["torch-gloo"].placement, REGISTRY["torch-gloo"].streams, REGISTRY["torch-gloo"].comm) == (
        "baseline", "one", "gloo")
