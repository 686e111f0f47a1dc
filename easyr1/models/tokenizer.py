"""Offline tokenizers for the tiny models: a small byte-level BPE with a real family's special tokens.

The vocabulary is trained locally on a built-in corpus, so tests never reach a hub. Special tokens are
appended after the learned vocabulary, as in the real Qwen and Llama-3 tokenizers, and the chat templates
render the same text layout as the real families.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

# Upper bound on the learned vocabulary (256 byte tokens + merges; the corpus yields ~950); special tokens
# come after it.
BPE_VOCAB_SIZE = 1024

# Words, symbols and phrases that the synthetic tasks and prompts use, so they encode into few tokens.
_WORDS = (
    "What is How many Solve Find Compute Calculate Count Answer answer the a an of in on to and or is are "
    "there image picture shapes shape circle circles square squares triangle triangles red green blue "
    "yellow black white color colors number numbers sum product difference total left right top bottom "
    "Think step by step Please reason put your final within Let us we x y z n value equation problem "
    "question first then so therefore because if else yes no true false plus minus times divided equals "
    "more less than greater smaller larger How much each every all none one two three four five six "
    "seven eight nine ten hundred thousand apples books students cars people minutes hours days year "
    "You are a helpful assistant. The user asks assistant system"
).split()
_TEMPLATES = (
    "What is {a} + {b}?",
    "What is {a} * {b}?",
    "What is {a} - {b}?",
    "Solve for x: {a}x + {b} = {c}.",
    "How many shapes are in the image?",
    "How many {w} are there?",
    "Compute {a} / {b} and put your final answer within \\boxed{{}}.",
    "<think>{a} + {b} = {c}</think> <answer>{c}</answer>",
    "<think>\nLet us think step by step.\n</think>\n<answer>\\boxed{{{c}}}</answer>",
    "The answer is $\\boxed{{{c}}}$.",
    "\\frac{{{a}}}{{{b}}} \\times {c} = \\sqrt{{{a}}} ^ {b} \\leq {c} \\geq \\pi \\cdot \\left( \\right)",
    "{w} {v} {u}. {W} {v}, {u}!",
)
_SYMBOLS = "0123456789 + - * / = ( ) [ ] { } < > ^ _ . , : ; ! ? $ % & | ~ ' \" \\ # @ \n\t"


def _corpus() -> list[str]:
    """A deterministic corpus (no randomness): every template filled with a fixed cycle of values."""
    # Each word alone and in a sentence, twice (BPE merges need a pair seen at least twice).
    lines = [_SYMBOLS, "".join(chr(c) for c in range(32, 127))] + ([" ".join(_WORDS)] + list(_WORDS)) * 2
    lines += ["\n\n", "\n\n"]
    words = _WORDS
    for i in range(600):
        a, b = (i * 7) % 101, (i * 13) % 37 + 1
        w, v, u = words[i % len(words)], words[(i * 3 + 1) % len(words)], words[(i * 5 + 2) % len(words)]
        fill = dict(a=a, b=b, c=a + b, w=w, v=v, u=u, W=w.capitalize())
        lines.append(_TEMPLATES[i % len(_TEMPLATES)].format(**fill))
    return lines


@dataclass(frozen=True)
class Family:
    """Special tokens and chat template of one model family."""

    name: str
    special_tokens: tuple[str, ...]
    chat_template: str
    eos_token: str
    added_tokens: tuple[str, ...]
    pad_token: str | None
    bos_token: str | None


# Content is a string or a list of parts: {"type": "text", "text": ...}, {"type": "image"}, {"type": "video"}.
_QWEN_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or 'image' in part or 'image_url' in part %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'video' or 'video' in part %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in part %}{{ part['text'] }}"
    "{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_LLAMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{% if message['content'] is string %}{{ message['content'] | trim }}"
    "{% else %}{% for part in message['content'] if 'text' in part %}{{ part['text'] | trim }}"
    "{% endfor %}{% endif %}"
    "<|eot_id|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)

# Same order as the real Qwen2/2.5/3 tokenizers (151643...); text models carry the vision tokens too.
QWEN = Family(
    name="qwen",
    special_tokens=(
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<|vision_start|>",
        "<|vision_end|>",
        "<|vision_pad|>",
        "<|image_pad|>",
        "<|video_pad|>",
    ),
    chat_template=_QWEN_TEMPLATE,
    eos_token="<|im_end|>",
    added_tokens=("<think>", "</think>"),  # ordinary (non-special) added tokens, as in Qwen3
    pad_token="<|endoftext|>",
    bos_token=None,
)

# Llama-3 has no pad token; loaders fall back to the eos token, as with the real models.
LLAMA3 = Family(
    name="llama3",
    special_tokens=(
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
    ),
    chat_template=_LLAMA3_TEMPLATE,
    eos_token="<|eot_id|>",
    added_tokens=(),
    pad_token=None,
    bos_token="<|begin_of_text|>",
)

FAMILIES = {family.name: family for family in (QWEN, LLAMA3)}


def _train_bpe(vocab_size: int) -> Tokenizer:
    """Byte-level BPE as GPT-2/Qwen/Llama-3 use; training on a fixed corpus is deterministic."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    return tokenizer


def build_tokenizer(family: str, vocab_size: int = BPE_VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """Train the BPE and wrap it with `family`'s special tokens and chat template ("qwen" or "llama3")."""
    if family not in FAMILIES:
        raise ValueError(f"unknown tokenizer family {family!r}; valid: {', '.join(FAMILIES)}")
    spec = FAMILIES[family]
    backend = _train_bpe(vocab_size)
    backend.add_special_tokens(list(spec.special_tokens))
    backend.add_tokens(list(spec.added_tokens))
    if spec.bos_token is not None:
        # Llama-3 prepends <|begin_of_text|> when encoding with special tokens, like the real tokenizer.
        bos_id = backend.token_to_id(spec.bos_token)
        backend.post_processor = processors.TemplateProcessing(
            single=f"{spec.bos_token} $A",
            pair=f"{spec.bos_token} $A {spec.bos_token} $B",
            special_tokens=[(spec.bos_token, bos_id)],
        )
    else:
        backend.post_processor = processors.ByteLevel(trim_offsets=False)
    named = {spec.eos_token, spec.pad_token, spec.bos_token}
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=spec.eos_token,
        pad_token=spec.pad_token,
        bos_token=spec.bos_token,
        extra_special_tokens=[t for t in spec.special_tokens if t not in named],
        chat_template=spec.chat_template,
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
    )
