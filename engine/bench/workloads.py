"""Named benchmark workloads: chat prompts, a shared system prompt, and requests arriving over time."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace

from engine.core.prompts import encode_prompt

TOPICS = [
    "the water cycle", "black holes", "sourdough bread", "the French revolution", "photosynthesis",
    "how vaccines work", "the stock market", "volcanoes", "machine learning", "the Roman empire",
    "coral reefs", "electric cars", "the human heart", "jazz music", "honey bees", "the Moon landing",
]  # fmt: skip
ASKS = [
    "Explain {t} to a ten-year-old.",
    "Give me three surprising facts about {t}.",
    "Write a short poem about {t}.",
    "What are the main open questions about {t}?",
]
SHARED_SYSTEM = (
    "You are the support assistant of Northwind Outfitters, a company that sells hiking, camping and climbing "
    "gear. Policies: orders ship within two business days; returns are accepted within 60 days if the item is "
    "unused and in its original packaging; worn footwear can be returned within 14 days for store credit; "
    "sleeping bags and tents carry a two-year warranty against manufacturing defects; climbing hardware cannot "
    "be returned once the packaging is opened, for safety reasons. Customers in the loyalty programme get free "
    "shipping and a 10% discount on full-price items. Always be concise and friendly, never promise delivery "
    "dates, and never invent products. If you do not know an answer, say that a human colleague will follow up "
    "by email within one business day. "
) * 2
QUESTIONS = [
    "Can I return boots I wore once?", "How long is the tent warranty?", "Do loyalty members pay shipping?",
    "Can I return an opened carabiner?", "When will my order ship?", "Is there a discount on sale items?",
    "My sleeping bag zipper broke after a year.", "Can I exchange a jacket for another size?",
]  # fmt: skip


EDIT_TEXT = (
    "Fix the spelling and grammar in this paragraph and return the whole corrected paragraph, nothing else:\n\n"
    "Our team have been working on the new release for severel weeks. The biggest change is a faster startup, "
    "which we achived by loading the model in the background while the window apears. We also fixed a bug "
    "where long chats would freese the window, and we made the history dialog easyer to search. Finally, "
    "the dashboard now shows how many tokens each chat recieved per second, so you can see the efect of "
    "batching for yourself. Please try it and tell us what you think of it."
)


# At least three facts: a reply runs to chat16's 64 tokens, as the free replies do (EOS banned), so the two
# workloads' throughputs compare the cost of a constrained token, not replies of other lengths
JSON_REPLY = {
    "type": "object",
    "properties": {
        "topic": {"type": "string"},
        "facts": {"type": "array", "items": {"type": "string"}, "minItems": 3, "maxItems": 6},
        "difficulty": {"enum": ["easy", "medium", "hard"]},
    },
    "required": ["topic", "facts", "difficulty"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class BenchRequest:
    prompt_ids: list[int]
    max_new_tokens: int
    arrival_s: float = 0.0  # offset from the start of the run
    json_schema: str | None = None  # the reply must be JSON valid against it (it may end before max_new_tokens)
    messages: list[dict] | None = None  # the chat the prompt was made from (a window types its last message)
    # sampled as a client asks, or greedy (0.0: every system makes the same tokens); seed: the same draws each run
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    requests: list[BenchRequest]

    @property
    def output_tokens(self) -> int:
        return sum(r.max_new_tokens for r in self.requests)

    @property
    def has_arrivals(self) -> bool:
        return any(r.arrival_s > 0 for r in self.requests)


def chat_prompts(count: int) -> list[str]:
    return [ASKS[(i // len(TOPICS)) % len(ASKS)].format(t=TOPICS[i % len(TOPICS)]) for i in range(count)]


def long_document(index: int, sentences: int) -> str:
    rng = random.Random(index)
    words = [t.split()[-1] for t in TOPICS]
    return " ".join(
        f"Note {n}: the {rng.choice(words)} report mentions {rng.randint(2, 99)} cases near the {rng.choice(words)}."
        for n in range(sentences)
    )


def conversation(text: str, system: str | None = None) -> list[dict]:
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]


def build(name: str, tokenizer, scale: float = 1.0) -> Workload:
    """The workload called `name`; scale < 1 shrinks token counts (tests use it on tiny models)."""

    def n(tokens: int) -> int:
        return max(2, int(tokens * scale))

    def chat(text: str, system: str | None = None) -> list[int]:
        return encode_prompt(tokenizer, messages=conversation(text, system))

    def asked(text: str, tokens: int, system: str | None = None) -> BenchRequest:
        return BenchRequest(chat(text, system), n(tokens), messages=conversation(text, system))

    if name == "single":
        return Workload(name, f"1 chat request, {n(128)} new tokens", [asked(chat_prompts(1)[0], 128)])
    if name == "sampled":
        # what an OpenAI client sends (temperature and top_p, no top_k): every logit of a step counts, where greedy
        # picks need only the leaders'
        request = replace(asked(chat_prompts(1)[0], 128), **SAMPLED)
        return Workload(
            name,
            f"1 chat request sampled as OpenAI clients ask (temperature 0.8, top_p 0.95), {n(128)} new tokens",
            [request],
        )
    if name == "edit":
        # one chat asking for an edit: the reply repeats most of its prompt (where prompt-lookup drafts pay)
        request = asked(EDIT_TEXT, 128)
        return Workload(
            name, f"1 chat request to correct a paragraph (the reply repeats it), {n(128)} new tokens", [request]
        )
    if name == "chat4":
        reqs = [asked(p, 128) for p in chat_prompts(4)]
        return Workload(name, f"4 different chat prompts at once, {n(128)} new tokens each", reqs)
    if name == "chat8":
        reqs = [asked(p, 64) for p in chat_prompts(8)]
        return Workload(name, f"8 different chat prompts at once, {n(64)} new tokens each", reqs)
    if name == "chat16":
        reqs = [asked(p, 64) for p in chat_prompts(16)]
        return Workload(name, f"16 different chat prompts at once, {n(64)} new tokens each", reqs)
    if name == "chat16-json":
        schema = json.dumps(JSON_REPLY)
        asks = [f"{p} Answer in JSON." for p in chat_prompts(16)]
        reqs = [BenchRequest(chat(p), n(64), json_schema=schema) for p in asks]
        return Workload(name, "chat16 with a JSON schema on every request (grammar-constrained)", reqs)
    if name == "chat64":
        reqs = [asked(p, 128) for p in chat_prompts(64)]
        return Workload(name, f"64 different chat prompts at once, {n(128)} new tokens each", reqs)
    if name == "shared-prefix":
        reqs = [asked(QUESTIONS[i % len(QUESTIONS)] + f" (ticket {i})", 32, SHARED_SYSTEM) for i in range(32)]
        return Workload(name, f"32 requests sharing a ~500-token system prompt, {n(32)} new tokens each", reqs)
    if name == "arrivals":
        rng = random.Random(7)
        reqs = []
        clock = 0.0
        for i in range(40):
            clock += rng.expovariate(2.0)  # about 2 requests a second
            if rng.random() < 0.25:
                prompt = chat("Summarise these notes in two sentences:\n" + long_document(i, rng.randint(15, 30)))
            else:
                prompt = chat(chat_prompts(64)[rng.randrange(64)])
            reqs.append(BenchRequest(prompt, n(rng.choice([16, 32, 64, 128])), arrival_s=clock * min(1.0, scale * 4)))
        return Workload(name, "40 requests arriving at ~2/s, mixed prompt (40-600 tokens) and output lengths", reqs)
    raise KeyError(name)


SAMPLED = {"temperature": 0.8, "top_p": 0.95, "seed": 1}
WORKLOADS = [
    "single", "sampled", "edit", "chat4", "chat8", "chat16", "chat16-json", "chat64", "shared-prefix", "arrivals",
]  # fmt: skip

BASELINES = ("sequential", "static", "generate-batch", "llama-cpp-server")
# Defaults keep one `bench` run to minutes on a 2-core CPU: the one-at-a-time baseline only where it finishes in
# reasonable time; `--baselines all` runs everything everywhere. llama.cpp's server runs where it is installed.
DEFAULT_BASELINES = {
    "single": ["sequential", "static", "generate-batch", "llama-cpp-server"],
    "sampled": ["llama-cpp-server"],  # transformers' baselines here decode greedily
    "edit": ["sequential", "llama-cpp-server"],
    "chat4": ["static", "llama-cpp-server"],
    "chat8": ["llama-cpp-server"],
    "chat16": ["sequential", "static", "generate-batch", "llama-cpp-server"],
    "chat16-json": [],  # against chat16's own engine figures: what the grammar costs
    "chat64": ["static", "llama-cpp-server"],
    "shared-prefix": ["static", "llama-cpp-server"],
    "arrivals": ["static", "generate-batch", "llama-cpp-server"],
}
