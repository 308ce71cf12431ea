"""What a model's tokens cost: the operator's ``LEASH_MODEL_PRICES`` first, then the
maintained table of the ``genai-prices`` package (offline: it ships its data). A model
neither names has no price, and its cost is shown as unknown -- never a guess shown as fact.

The table is asked with the provider's address (``LEASH_MODEL_URL``, or when it is unset the
address the backend's SDK calls, its ``default_url``: api.openai.com, api.anthropic.com): a
provider the table knows by its address prices its own models only. An address it does not
know (a proxy, a gateway such as LiteLLM, your own server) is priced by the model's name across
the table's providers, as ``genai_prices.calc_price`` finds it without an address
(``gpt-4o-mini`` is OpenAI's; ``openai/gpt-4o-mini``, a gateway's form, is looked up at the
provider it names). A name no provider has (``smollm2-135m`` on your own server) has no price.

A call run in a provider's batch (``Usage.batch``) costs the price times its ``batch``
multiplier: 0.5 for OpenAI's and Anthropic's models (both halve batch prices), 1 for a table
provider not known to discount; a ``LEASH_MODEL_PRICES`` entry may set its own (``"batch": 0.5``,
the default there too). Direct calls are priced as before.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache

from jobs import config

log = logging.getLogger("leash.usage")

#: The OpenAI SDK's default address: with no LEASH_MODEL_URL, calls go there.
OPENAI_API_URL = "https://api.openai.com/v1"
NANO_PER_USD = 1_000_000_000
#: What a batch's tokens cost against direct ones: OpenAI's Batch API and Anthropic's Message
#: Batches both charge half.
BATCH_DISCOUNT = 0.5
#: genai-prices providers whose batch APIs give that discount.
BATCH_DISCOUNT_PROVIDERS = {"openai", "anthropic"}


@dataclass(frozen=True)
class Price:
    """USD per 1M tokens; ``cached_input`` for input tokens the provider served from its cache;
    ``batch`` the multiplier for tokens run in a provider's batch."""

    input: float
    output: float
    cached_input: float | None = None
    source: str = "LEASH_MODEL_PRICES"
    batch: float = BATCH_DISCOUNT

    def nano_usd(self, input_tokens: int, output_tokens: int, cached_input_tokens: int = 0,
                 batch: bool = False) -> int:
        """The cost in nano-USD. ``input_tokens`` includes the cached ones, as providers count;
        ``batch``: the tokens ran in a provider's batch."""
        cached = min(max(cached_input_tokens, 0), input_tokens)
        cached_rate = self.input if self.cached_input is None else self.cached_input
        micro = (input_tokens - cached) * self.input + cached * cached_rate + output_tokens * self.output
        return round(micro * 1000 * (self.batch if batch else 1))


def parse_overrides(text: str | None) -> dict[str, Price]:
    """``LEASH_MODEL_PRICES``: ``{"<model>": {"input": USD per 1M, "output": USD per 1M,
    "cached_input": optional, "batch": optional multiplier}}``; a ValueError naming the setting
    when it is not that."""
    if not text:
        return {}
    try:
        table = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"LEASH_MODEL_PRICES must be JSON: {exc}") from None
    if not isinstance(table, dict):
        raise ValueError('LEASH_MODEL_PRICES must be a JSON object: {"<model>": {"input": ..., "output": ...}}')
    prices = {}
    for model, entry in table.items():
        fields = entry if isinstance(entry, dict) else {}
        numbers = {k: fields.get(k) for k in ("input", "output", "cached_input", "batch")}
        if any(not _price_number(numbers[k]) for k in ("input", "output")) or \
                (numbers["cached_input"] is not None and not _price_number(numbers["cached_input"])):
            raise ValueError(f"LEASH_MODEL_PRICES[{model!r}] must be {{\"input\": <USD per 1M tokens>, "
                             f"\"output\": <USD per 1M tokens>}} with numbers >= 0, got {json.dumps(entry)[:80]}")
        batch = numbers["batch"]
        if batch is not None and not (_price_number(batch) and batch <= 1):
            raise ValueError(f"LEASH_MODEL_PRICES[{model!r}][\"batch\"] must be a multiplier from 0 to 1 "
                             f"(0.5: batches cost half), got {json.dumps(batch)[:40]}")
        prices[str(model)] = Price(float(numbers["input"]), float(numbers["output"]),
                                   None if numbers["cached_input"] is None else float(numbers["cached_input"]),
                                   batch=BATCH_DISCOUNT if batch is None else float(batch))
    return prices


def _price_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 1e6


def price_for(model: str, provider_url: str | None = None) -> Price | None:
    """The price of ``model`` at ``provider_url`` (default: LEASH_MODEL_URL), or None."""
    overrides = parse_overrides(config.model_calls().model_prices)
    if model in overrides:
        return overrides[model]
    return _table_price(model, _url(provider_url))


def _url(provider_url: str | None) -> str:
    url = provider_url if provider_url is not None else (config.model_calls().model_url or "").strip()
    return url or OPENAI_API_URL


def _known_address(provider_url: str) -> bool:
    """Whether the table knows the provider at this address (else: priced by model name)."""
    from genai_prices.data_snapshot import get_snapshot
    try:
        get_snapshot().find_provider(None, None, provider_url)
    except LookupError:
        return False
    return True


@lru_cache(maxsize=256)
def _table_price(model: str, provider_url: str) -> Price | None:
    try:
        from genai_prices import Usage, calc_price
    except ImportError:  # pragma: no cover - a dependency; its absence only loses table prices
        return None
    try:
        if _known_address(provider_url):
            where: dict = {"provider_api_url": provider_url}
            how = ""
        else:  # a proxy, a gateway, your own server: the model's name, across the table's providers
            where, how = {}, " (by model name)"
            prefix, _, rest = model.partition("/")
            if rest:  # a gateway's "<provider>/<model>"
                where = {"provider_id": prefix}
                model = rest
        # Priced as a thousand of each and scaled to a million: a tiered price (Anthropic's above
        # 200k prompt tokens) reads at its first tier's rate, where a call's prompt is.
        sample = 1_000
        found = calc_price(Usage(input_tokens=sample, output_tokens=0), model_ref=model, **where)
        out = calc_price(Usage(input_tokens=0, output_tokens=sample), model_ref=model, **where)
        cached = calc_price(Usage(input_tokens=sample, cache_read_tokens=sample), model_ref=model, **where)
    except LookupError:
        return None
    except Exception as exc:  # a table that cannot price this model is "no price", not a crash
        log.warning("genai-prices could not price %s at %s: %s", model, provider_url, exc)
        return None
    per_million = Decimal(1_000_000 // sample)
    return Price(float(Decimal(found.total_price) * per_million), float(Decimal(out.total_price) * per_million),
                 float(Decimal(cached.total_price) * per_million), source=f"genai-prices {found.provider.id}{how}",
                 batch=BATCH_DISCOUNT if found.provider.id in BATCH_DISCOUNT_PROVIDERS else 1.0)


def why_no_price(model: str | None = None, provider_url: str | None = None) -> str:
    """Why calls of ``model`` (default: LEASH_MODEL_NAME) have no cost, and what to set; a
    phrase that follows "cost unknown: "."""
    model = model or (config.model_calls().model_name or "").strip() or None
    text = config.model_calls().model_prices
    if model is None:
        return "no price for the model; set LEASH_MODEL_PRICES to name its price"
    example = f'{{"{model}": {{"input": <USD per 1M tokens>, "output": <USD per 1M tokens>}}}}'
    try:
        overrides = parse_overrides(text)
    except ValueError as exc:
        return f"no price for {model}: {exc}"
    if model in overrides:
        return f"{model}'s calls ran before LEASH_MODEL_PRICES named its price; later calls are priced"
    if text:
        return f"no price for {model}: LEASH_MODEL_PRICES is set but has no entry for it; add {example}"
    url = _url(provider_url)
    where = f"at {url}" if _known_address(url) else "under any provider"
    return (f"no price for {model}: the genai-prices table has no such model {where}; "
            f"set LEASH_MODEL_PRICES to {example}")


def usd(nano: int | None) -> float | None:
    """nano-USD as dollars (rounded to a millionth of a cent, beyond any bill's precision)."""
    return None if nano is None else round(nano / NANO_PER_USD, 8)


def nano(dollars: float) -> int:
    return round(dollars * NANO_PER_USD)


#: Significant digits an amount under a dollar keeps (trailing zeros dropped): $0.002019 is
#: not $0.0020, and an owner's day budget of $0.006 is not "$0.01".
SIGNIFICANT = 4


def money(usd: float | None) -> str:
    """``$0.000037``, ``$0.002019``, ``$0.012``, ``$0.42``, ``$12.30``, ``$1,234.50``; ``$0``
    for nothing; ``unknown`` for None."""
    if usd is None:
        return "unknown"
    if usd == 0:
        return "$0"
    if abs(usd) >= 1:
        return f"${usd:,.2f}"
    decimals = max(2, SIGNIFICANT - 1 - math.floor(math.log10(abs(usd))))
    whole, _, fraction = f"{usd:.{decimals}f}".partition(".")
    fraction = fraction.rstrip("0")
    return f"${whole}.{fraction.ljust(2, '0')}"
