"""The data section of the run config (``data.*``): which prompts, how long, in what batches.

Each field's docstring is its documentation (``easyr1 config --explain data.KEY`` prints it).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DataConfig:
    train_files: str = ""
    """Training prompts: a parquet/json/jsonl file or folder, or a hub data set, with an optional ``@split``."""
    val_files: str = ""
    """Validation prompts, in the same forms as ``train_files``; empty: no validation."""
    prompt_key: str = "prompt"
    """The column holding each prompt (EasyR1's math examples use ``problem``)."""
    answer_key: str = "answer"
    """The column holding the ground truth the reward function compares with."""
    image_key: str = "images"
    """The column holding each prompt's images (bytes dicts, paths, or PIL images)."""
    video_key: str = "videos"
    """The column holding each prompt's videos (paths, or lists of frame paths)."""
    image_dir: str | None = None
    """A folder that relative image and video paths are joined to; null: relative to the working directory."""
    video_fps: float = 2.0
    """Frames sampled per second of video."""
    # The most frames sampled from one video (rounded down to an even count): qwen-vl-utils, which
    # EasyR1 decodes with, allows 768; 128 keeps a long video's prompt within reach of a GPU.
    video_max_frames: int = 128
    """The most frames sampled from one video, rounded down to an even count."""
    max_prompt_length: int = 512
    """The most tokens of a prompt (images' tokens included); longer prompts are filtered out or refused."""
    max_response_length: int = 512
    """The most tokens the rollout generates for one response."""
    rollout_batch_size: int = 512
    """Prompts per training step (each sampled ``worker.rollout.n`` times), over all ranks."""
    mini_rollout_batch_size: int | None = None
    """Prompts generated at a time within a step (online filtering draws batches of it); null: the whole batch."""
    val_batch_size: int = -1
    """Validation prompts generated at a time; -1: the whole validation set at once."""
    format_prompt: str | None = None
    """A Jinja file that wraps each prompt (``{{ content }}``) before the chat template; null: the prompt as is."""
    override_chat_template: str | None = None
    """A file whose Jinja chat template replaces the tokenizer's; null: the tokenizer's own."""
    shuffle: bool = True
    """Shuffle the training prompts each epoch (seeded by ``seed``)."""
    seed: int = 1
    """The seed of the training prompts' shuffle."""
    min_pixels: int | None = 262144
    """Images smaller than this many pixels are scaled up to it; null: no lower bound."""
    max_pixels: int | None = 4194304
    """Images larger than this many pixels are scaled down to it; null: no upper bound."""
    filter_overlong_prompts: bool = True
    """Drop prompts longer than ``max_prompt_length`` when the data set loads; false: such a prompt is an error."""
    filter_overlong_prompts_workers: int = 16
    """Processes that measure the prompts' lengths for ``filter_overlong_prompts``."""
