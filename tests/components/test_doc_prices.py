"""Every price in README.md and docs/ comes from the one computation (issue 34 item 2: the README said $8.00 a month
for the cache disk while `tpuserve cost` and the stack said $28.80).

Each dollar figure a page prints is in a phrase below, formatted from tpuserve/facts.py, tpuserve/data/prices.json,
the stack's settings and the cost and plan functions. A phrase missing from its page fails (the page or the
computation changed), and so does a dollar figure that no phrase accounts for (a price typed by hand).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
DOLLARS = re.compile(r"\$\s?\d[\d,]*(?:\.\d+)?")


@functools.cache
def computed() -> dict[str, float]:
    """The figures, each from where it is owned."""
    from components.config import build_stack_config
    from components.gke import GATEWAY_SYSTEM_MACHINE_TYPE, SYSTEM_MACHINE_TYPE
    from tests.fakes.pulumi_harness import stack_file_config
    from tpuserve.deploy.inventory import prices
    from tpuserve.facts import (DEFAULT_CACHE_DISK_GB, DEFAULT_CACHE_DISK_IOPS, DEFAULT_CACHE_DISK_MIBPS,
                                HYPERDISK_BALANCED_USD_PER_GB_MONTH, PRICE_PER_CHIP_HOUR)
    from tpuserve.measure import cost, plan

    dev = build_stack_config(stack_file_config("dev"))
    weights = plan.resolve_model(None, None, None).weights_gib
    free = plan.DiskPlan(DEFAULT_CACHE_DISK_GB, DEFAULT_CACHE_DISK_MIBPS, DEFAULT_CACHE_DISK_IOPS, weights)
    fast = plan.DiskPlan(DEFAULT_CACHE_DISK_GB, 400, DEFAULT_CACHE_DISK_IOPS, weights)
    saved_s = round(free.warm_boot_s) - round(fast.warm_boot_s)
    api_price = next(p.default for p in cost.cost.params if p.name == "api_price_per_m")
    sample = cost.session(PRICE_PER_CHIP_HOUR, api_price, 4, 10, 498.8)  # the toolkit's sample: runs/cpu, c=2
    table = prices()
    return {
        "chip_hour": PRICE_PER_CHIP_HOUR,
        "dev_run_h": dev.max_run_seconds / 3600,
        "dev_run": dev.max_run_seconds / 3600 * PRICE_PER_CHIP_HOUR,  # the stack's worstCaseCostUsd
        "four_chip_run": 4 * 4 * PRICE_PER_CHIP_HOUR,
        "gb_month": HYPERDISK_BALANCED_USD_PER_GB_MONTH,
        "cache_disk": dev.cache_disk_monthly_usd,  # the stack's cacheMonthlyCostUsd at the defaults
        "cache_disk_fast": fast.monthly_usd()["total"],
        "fast_extra": fast.monthly_usd()["throughput"],
        "free_boot_s": round(free.warm_boot_s),
        "fast_boot_s": round(fast.warm_boot_s),
        "saved_s": saved_s,
        "tpu_for_saved_s": saved_s / 3600 * PRICE_PER_CHIP_HOUR,
        "gke_node": table["machineTypesPerHour"][SYSTEM_MACHINE_TYPE],
        "gke_gateway_node": table["machineTypesPerHour"][GATEWAY_SYSTEM_MACHINE_TYPE],
        "gke_fee": table["gkeCluster"]["feePerHour"],
        "gke_free_tier": table["gkeCluster"]["freeTierPerMonth"],
        "api_price": api_price,
        "cold_start": cost.cold_start_usd(PRICE_PER_CHIP_HOUR, 10),
        "session": sample.usd,
        "session_per_m": sample.usd_per_m_output,
        # `tpuserve cost --chips 4 --engines 4 --output-tok-s 2140`: four chips billed, four engines serving
        "four_engines_per_m": cost.session(4 * PRICE_PER_CHIP_HOUR, api_price, 4, 10, 4 * 2140).usd_per_m_output,
        "status_sample": 72 / 60 * PRICE_PER_CHIP_HOUR,  # `status`'s sample: up 1h 12m on one chip
    }


def phrases() -> dict[str, list[str]]:
    """page -> the phrases holding its prices, as the page words them (whitespace aside)."""
    c = computed()
    boot = (f"about {c['free_boot_s']} s to serving at the free 140 MiB/s against {c['fast_boot_s']} s at 400")
    return {
        "README.md": [
            f"**${c['chip_hour']:.2f} per chip-hour**",
            f"at most {c['dev_run_h']:g} h × ${c['chip_hour']:.2f} = **${c['dev_run']:.2f}** per default dev run",
            f"${c['gb_month']:.2f} per GB-month = **${c['cache_disk']:.2f} a month**",
            f"| a gke cluster | ≈ ${c['gke_node']:.2f}/h: its system node (GKE's free tier covers one zonal cluster's "
            f"${c['gke_fee']:.2f}/h fee) |",
            f"the disk bills ≈ ${c['cache_disk']:.0f} a month",
        ],
        "docs/deploy.md": [
            f"**${c['chip_hour']:.2f} per chip-hour**",
            f"at most {c['dev_run_h']:g} h × 1 chip × ${c['chip_hour']:.2f} = **${c['dev_run']:.2f}**",
            f"100 GB × **${c['gb_month']:.2f} per GB-month**",
            f"= **${c['cache_disk']:.2f} a month**",
            f"except the cache disk (≈ ${c['cache_disk']:.0f} a month)",
        ],
        "docs/boot-and-caches.md": [
            boot,
            f"(${c['cache_disk']:.2f} at the defaults for 100 GB, ${c['cache_disk_fast']:.2f} at 400 MiB/s",
            f"The {c['saved_s']} s are worth ${c['fast_extra']:.2f} a month",
            f"(the TPU bills ${c['tpu_for_saved_s']:.3f} for {c['saved_s']} s)",
        ],
        "docs/getting-a-tpu.md": [f"4 h x 4 chip(s) x ${c['chip_hour']:.2f} = ${c['four_chip_run']:.2f}"],
        "docs/more-than-one-chip.md": [
            f"**${c['chip_hour']:.2f} per chip-hour**",
            f"4 --engines 4 --output-tok-s 2140` prices it at ${c['four_engines_per_m']:.3f} per M output tokens",
            f"the system node ≈ ${c['gke_node']:.2f}/h (≈ ${c['gke_gateway_node']:.2f}/h with the inference gateway, "
            f"whose picker asks for 8 CPUs); the cluster is zonal, so its fee (${c['gke_fee']:.2f}/h) is covered",
        ],
        "docs/gke.md": [
            f"| the cluster's management fee | ${c['gke_fee']:.2f} per cluster-hour; GKE's free tier gives each billing "
            f"account ${c['gke_free_tier']:.2f} a month",
            "| while the cluster exists; $0 for the first zonal cluster of the billing account |",
            f"`e2-standard-4` (≈ ${c['gke_node']:.2f}/h); `e2-standard-16` with the inference gateway (four times the "
            f"vCPUs and memory, ≈ ${c['gke_gateway_node']:.2f}/h)",
            f"| the TPU nodes | ${c['chip_hour']:.2f} per chip-hour each",
        ],
        "docs/design/benchmarks.md": [f"**${c['chip_hour']:.2f} per chip-hour**"],
        "docs/toolkit.md": [
            f"cost so far ${c['status_sample']:.2f} (at ${c['chip_hour']:.2f} per chip-hour)",
            f"Breakeven vs ${c['api_price']:g}/M: 937.5 output tok/s sustained at ${c['chip_hour']:g}/h",
            f"One cold start (10 min): ${c['cold_start']:.3f}",
            f"3,000 IOPS): ${c['cache_disk']:.2f} / month while it exists, VM or not",
            f"cost ${c['session']:.2f}; 3.83 h serving after the cold start yields 6.88 M output tokens = "
            f"${c['session_per_m']:.3f} / M",
            f"Cache disk cost ${c['cache_disk']:.2f} / month while it exists: 100 GB ${c['cache_disk']:.2f} + "
            "throughput $0.00 + IOPS $0.00",
            f"{c['fast_boot_s']} s to serving, for ${c['fast_extra']:.2f} a month more (${c['cache_disk_fast']:.2f} in "
            f"all): {c['saved_s']} s a warm boot, which the TPU bills at ${c['tpu_for_saved_s']:.3f}",
        ],
    }


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("page", sorted(phrases()))
def test_each_price_on_the_page_is_the_computed_one(page: str):
    text = flat((ROOT / page).read_text())
    missing = [phrase for phrase in phrases()[page] if flat(phrase) not in text]
    assert not missing, f"{page} does not say what the computation gives: {missing}"


@pytest.mark.parametrize("path", PAGES, ids=[str(path.relative_to(ROOT)) for path in PAGES])
def test_no_page_prints_a_price_that_is_not_computed(path: Path):
    text = flat(path.read_text())
    for phrase in phrases().get(str(path.relative_to(ROOT)), []):
        text = text.replace(flat(phrase), " ")
    stray = [text[max(0, m.start() - 50):m.end() + 20] for m in DOLLARS.finditer(text)]
    assert not stray, f"{path.name}: prices no computation gives (add each to tests/components/test_doc_prices.py): {stray}"


def test_the_default_cache_disk_is_the_free_performance_and_bills_its_capacity_only():
    """The default is decided on what users pay for: the 45 s the faster disk saves a warm boot cost the TPU far
    less than the disk's monthly price unless a stack boots warm more than a thousand times a month."""
    c = computed()
    assert (c["cache_disk"], c["cache_disk_fast"], c["fast_extra"]) == (8.0, 28.8, 20.8)
    assert c["fast_extra"] / c["tpu_for_saved_s"] > 1000
