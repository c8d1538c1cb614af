"""train.py's settings: `TrainConfig` (every setting, its default and meaning, and the rules between them) and
the forms a run shows and saves them in. config_load.py fills it from config files and --key=value arguments.
Imports nothing heavy at module level, so `python train.py --help` answers at once. Details: docs/training.md."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from pilegpt import storage
from pilegpt.common import UserError

# GPTConfig's fields, but dropout: a run's checkpoints hold this model
ARCH_FIELDS = ("pos_emb", "rope_theta", "norm", "mlp", "n_kv_head", "qk_norm", "tie_embeddings", "logit_softcap",
               "x0_scalars", "value_embeds", "embed_norm", "smear", "backout", "qk_scale")
SHAPE_FIELDS = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "bias", *ARCH_FIELDS)
CUSTOM_MODEL_FIELDS = ("model_class", "model_args")  # your own model instead of the GPT (model_contract.py)
# settings that shape nothing of a model_class
GPT_ONLY_FIELDS = ("n_layer", "n_head", "n_embd", "bias", *ARCH_FIELDS, "dropout", "weight_init")
MAX_LR = 1e6  # the largest learning rate of any kind a run accepts
# AdamW's rates for parts of the GPT: pilegpt/train/optim/groups.py
PART_RATES = ("embedding_lr", "head_lr", "scalar_lr")
# Muon's options, one entry each: the setting -> (Muon's constructor argument and group key, the value a checkpoint
# from before that key ran with; None: the key is as old as Muon). groups.build_optimizer, the autoresume check
# (optim/on_resume.py) and the "unused with optimizer='adamw'" note all read this table.
MUON_OPTIONS = {"muon_momentum": ("momentum", None), "muon_momentum_warmup": ("momentum_warmup", 0),
                "muon_cautious_wd": ("cautious_wd", False), "muon_normuon": ("normuon", False),
                "muon_polar_express": ("polar_express", False), "muon_wd_cosine": ("wd_cosine", 0),
                "muon_momentum_warmdown": ("momentum_warmdown", 0.0)}
MUON_SETTINGS = ("muon_lr", *MUON_OPTIONS, "muon_weight_decay")  # what optimizer="adamw" leaves unused
DATA_KEYS = ("data_dir", "data_remote", "data_mix")  # three ways to name the data: one per run

# What a setting changed on autoresume does: one row per TrainConfig setting, (kind, rule). run/folder.py's checks
# before training read it, and tests/unit/test_config.py walks it (a setting without a row fails). The kinds:
USED = "used"  # the resumed run uses the new value from its checkpoint on, as it would have from the start
SAID = "said"  # used, and a line names it: the checkpoint brought its own value (optim/on_resume.py puts ours back)
REFUSED = "refused"  # a value other than config.json's: one line before training; the rule says what differs
INIT_ONLY = "init-only"  # acts only when a run starts: a note says so, and the run (config.json too) keeps its value
DATA = "data"  # data.json compares the data itself (data_record.py): other data is refused unless data_changed_ok
PART_GROUP = "said; refused set or unset"  # a part's own rate: its parameter group is there or not in the checkpoint
RESUME_KINDS = (USED, SAID, REFUSED, INIT_ONLY, DATA, PART_GROUP)
ON_RESUME = {
    **dict.fromkeys((*SHAPE_FIELDS, *CUSTOM_MODEL_FIELDS), (REFUSED, "another model")),  # the weights do not fit
    "optimizer": (REFUSED, "another optimizer"),  # its state is another optimizer's
    "seed": (REFUSED, "another seed, which orders the data (a new one mid-epoch repeats and skips samples)"),
    "dropout": (USED, "a probability at each training step"),
    **dict.fromkeys(("weight_init", "init_from"),
                    (INIT_ONLY, "the weights come from the checkpoint")),
    **dict.fromkeys(("data_dir", "data_remote", "data_mix", "data_format"),
                    (DATA, "the data's content and its rows, not where it lies (a moved copy resumes)")),
    "num_canonical_nodes": (DATA, "data.json's fixes the MDS sample order: another is refused, None takes it"),
    **dict.fromkeys(("data_local", "data_cache_limit", "num_workers"),
                    (USED, "where and how the same samples are read")),
    **dict.fromkeys(("global_batch_size", "device_train_microbatch_size", "device_eval_batch_size"),
                    (USED, "the resume goes on at the sample the run reached")),
    **dict.fromkeys(("learning_rate", "muon_lr", "lr_base_width", "weight_decay", "beta1", "beta2", *MUON_OPTIONS),
                    (SAID, "the optimizer's parameter groups (optim/on_resume.py)")),
    **dict.fromkeys(PART_RATES, (PART_GROUP, "a change between rates is said, as learning_rate's")),
    "muon_weight_decay": (SAID, "Muon's group's weight_decay (optim/on_resume.py names it weight_decay)"),
    **dict.fromkeys(("min_lr", "lr_schedule", "warmdown", "warmup", "max_duration", "grad_clip"),
                    (USED, "the schedule and the clipping are computed at each batch")),
    **dict.fromkeys(("eval_interval", "eval_subset_num_batches", "eval_data", "hellaswag_examples", "hellaswag_data",
                     "core_examples", "core_data", "sample_prompt", "sample_length"),
                    (USED, "evaluations and samples from the resume on")),
    **dict.fromkeys(("device", "precision", "compile", "activation_checkpointing", "cpu_malloc_tune", "dist_timeout",
                     "preemption_grace_s"), (USED, "how this process runs; the checkpoint holds weights and state")),
    "fsdp": (REFUSED, "another checkpoint format: fsdp=True's are sharded folders, fsdp=False's whole files (either "
                      "resumes on any number of processes)"),
    **dict.fromkeys(("run_name", "save_folder", "autoresume", "save_overwrite", "data_changed_ok"),
                    (USED, "they find the run and say what a resume may do")),
    **dict.fromkeys(("save_interval", "save_num_checkpoints_to_keep", "progress_bar", "log_interval", "speed_window",
                     "wandb_log", "wandb_project", "tensorboard_log", "tensorboard_dir", "mlflow_log",
                     "mlflow_experiment"), (USED, "checkpoints and logs from the resume on")),
    **dict.fromkeys(("algorithms", "callbacks"), (USED, "from the resume on; Composer loads the checkpoint's state of "
                                                        "those it holds by its own rules")),
}


@dataclass
class TrainConfig:
    # model (GPTConfig)
    n_layer: int = 12  # transformer blocks
    n_head: int = 12  # attention heads per block
    n_embd: int = 768  # residual stream width; a multiple of n_head
    block_size: int = 1024  # tokens per training sample (context length T)
    vocab_size: int = 50257  # GPT-2 BPE; 50304 (a multiple of 64) runs faster on GPU
    dropout: float = 0.0  # 0.0 for pretraining
    bias: bool = True  # biases in Linear and LayerNorm, like GPT-2
    pos_emb: str = "learned"  # positions: "learned" (GPT-2's table) or "rope" (rotary, no parameters)
    rope_theta: float = 10000.0  # RoPE's base (pos_emb="rope")
    norm: str = "layernorm"  # "layernorm" (GPT-2), "rmsnorm" or "rmsnorm_free" (RMSNorm without a learned gain)
    mlp: str = "gelu"  # "gelu" (GPT-2), "relu2" (ReLU squared) or "swiglu" (Llama's, hidden 8/3 n_embd up to 256s)
    n_kv_head: Optional[int] = None  # key/value heads; None = n_head, fewer (dividing n_head) = grouped-query
    qk_norm: bool = False  # normalize each head's q and k (norm's kind) before attention
    tie_embeddings: bool = True  # one matrix for token embeddings and output head, like GPT-2
    logit_softcap: float = 0.0  # logits = softcap * tanh(logits / softcap); 0 = off
    x0_scalars: bool = False  # learned per-block scalars: x = resid_lambdas[i] * x + x0_lambdas[i] * x0 (embeddings)
    value_embeds: bool = False  # gated token tables added to v on every other block, the last too (nanochat)
    embed_norm: bool = False  # the token embeddings RMS-normalised (no gain) before the blocks (nanochat)
    smear: bool = False  # each position adds a gated share of the previous token's embedding (nanochat's smear)
    backout: bool = False  # the head reads x minus a learned share of the middle block's residual (nanochat)
    qk_scale: float = 1.0  # q and k times this after QK-norm (nanochat: 1.2, attention scores x 1.44)
    weight_init: str = "gpt2"  # from scratch: "gpt2" (N(0, 0.02)) or "nanochat" (its scales: model.nanochat_init)
    init_from: str = "scratch"  # weights: scratch, gpt2(-medium/-large/-xl), a HF GPT-2 folder, a pile-gpt checkpoint
    model_class: str = ""  # your own nn.Module, "package.module:Class" (docs/extending.md); "" = model.py's GPT
    model_args: dict = field(default_factory=dict)  # keyword arguments of model_class's constructor
    # data
    data_dir: Optional[str] = None  # local folder: prepare_data's train.bin/val.bin, or MDS train/ and val/
    data_remote: Union[str, list[str], None] = None  # MDS root with train/ (+ val/), local or s3://; a list: streams
    data_mix: dict = field(default_factory=dict)  # instead of data_dir: {ROOT: {"repeat": 2.0}, ...} mixed by weight
    data_local: str = "data/mds_cache"  # local cache of remote MDS shards (one subfolder per root and split)
    data_cache_limit: Union[int, str, None] = None  # most bytes each MDS split keeps cached ("50gb"); None: all
    data_format: str = "auto"  # "auto" (look inside data_dir), "bin" or "mds"
    num_workers: int = 0  # DataLoader worker processes per rank (0 = load in the training process)
    num_canonical_nodes: Optional[int] = None  # MDS sample order (Streaming's); None = the run's first node count
    # batch
    global_batch_size: int = 480  # sequences per optimizer step over all ranks (x block_size tokens)
    device_train_microbatch_size: Union[int, str] = 12  # sequences per forward/backward per device; "auto" (GPU)
    device_eval_batch_size: Optional[int] = None  # eval sequences per batch per device; None = the train microbatch
    # optimizer and schedule
    optimizer: str = "adamw"  # "adamw", or "muon": Muon for the blocks' 2-D weights, AdamW for the rest
    learning_rate: float = 6e-4  # peak learning rate, reached after warmup (AdamW's, also with optimizer="muon")
    muon_lr: float = 0.02  # Muon's peak learning rate (optimizer="muon"), on the same schedule as learning_rate
    embedding_lr: float = 0.0  # AdamW's peak rate for the embedding tables (wte, wpe, value_embeds); 0 = learning_rate
    head_lr: float = 0.0  # AdamW's peak rate for the untied output head (lm_head); 0 = learning_rate
    scalar_lr: float = 0.0  # AdamW's peak rate for x0_lambdas, smear and backout (not width-scaled); 0 = learning_rate
    lr_base_width: int = 0  # > 0: AdamW's rates (these 3, min_lr) are at this n_embd, x (lr_base_width/n_embd)**0.5
    muon_momentum: float = 0.95  # Muon's momentum (Nesterov)
    muon_momentum_warmup: int = 0  # Muon's momentum rises from 0.85 to muon_momentum over this many steps; 0 = off
    muon_momentum_warmdown: float = 0.0  # > 0: the momentum falls linearly to this over wsd's warmdown; 0 = stays
    muon_cautious_wd: bool = False  # Muon's weight decay only where the update also pulls a weight towards 0
    muon_normuon: bool = False  # NorMuon: Muon's update evened out over output neurons by their second moment
    muon_polar_express: bool = False  # Muon's orthogonalisation: Polar Express's coefficients, not Newton-Schulz's
    muon_weight_decay: Optional[float] = None  # Muon's own weight decay; None = weight_decay's (AdamW keeps that)
    muon_wd_cosine: bool = False  # Muon's weight decay falls from its value to 0 as a cosine over max_duration
    min_lr: float = 6e-5  # learning rate at the end of the schedule (max_duration)
    lr_schedule: str = "cosine"  # "cosine": warmup, cosine decay; "wsd": warmup, the peak, a linear warmdown
    warmdown: float = 0.2  # lr_schedule="wsd": the last fraction of max_duration, where the rate falls to min_lr
    weight_decay: float = 0.1  # decoupled weight decay on 2-D weights only (p -= lr * weight_decay * p)
    beta1: float = 0.9  # AdamW beta1
    beta2: float = 0.95  # AdamW beta2
    grad_clip: float = 1.0  # clip the gradient's global norm to this; 0 = no clipping
    warmup: str = "700ba"  # linear warmup, a Composer time string in max_duration's unit (or "0.01dur")
    max_duration: str = "19073ba"  # training length: "19073ba" batches, "10000000000tok" tokens, "1ep" epochs
    # evaluation
    eval_interval: str = "1000ba"  # evaluate on the val split this often (and at the end)
    eval_subset_num_batches: int = 20  # val batches per evaluation, all processes together; -1 = all
    eval_data: dict = field(default_factory=dict)  # more eval sets by name: {"owt": "data/owt", "pile": "s3://b/mds"}
    hellaswag_examples: int = 0  # HellaSwag examples scored at every evaluation (eval.py's scoring); 0 = off, -1 = all
    hellaswag_data: Optional[str] = None  # a local HellaSwag .jsonl; None = the official val set (downloaded once)
    core_examples: int = 0  # CORE at every evaluation on the first N rows of each task (eval.py's); 0 = off, -1 = all
    core_data: Optional[str] = None  # an unpacked DCLM eval bundle; None = downloaded once (eval.py --task core's)
    sample_prompt: str = ""  # prompt of the text sample printed at each evaluation; "" = <|endoftext|>
    sample_length: int = 48  # tokens generated for that sample; 0 = no samples
    # system
    device: str = "auto"  # "auto" (GPU when CUDA is available), "gpu" or "cpu"
    precision: str = "auto"  # "auto" (amp_bf16 on GPU, fp32 on CPU), "fp32", "amp_bf16", "amp_fp16"
    compile: Union[bool, str] = False  # torch.compile the model; "auto": on a GPU only (config/pile*.py)
    fsdp: bool = False  # shard parameters, gradients and optimizer state over the processes (FSDP2; GPU or CPU)
    activation_checkpointing: bool = False  # recompute each Block's activations in the backward pass (less memory)
    seed: int = 1337  # seeds model init, data order and dropout
    cpu_malloc_tune: bool = True  # on CPU with glibc: keep big freed blocks for reuse (fewer page faults)
    dist_timeout: float = 300.0  # seconds a process waits for the job's others (at start, in a collective)
    preemption_grace_s: float = 300.0  # seconds from a scheduler's SIGTERM to its SIGKILL (sbatch --signal=TERM@300)
    # checkpoints and logs
    run_name: Optional[str] = None  # name of the run; None = the last config file's name (e.g. "pile")
    save_folder: str = "runs/{run_name}"  # checkpoints, export, config and logs: local folder or s3://bucket/prefix
    save_interval: str = "1000ba"  # checkpoint (and model.pt export) this often, and at the end
    save_num_checkpoints_to_keep: int = -1  # local checkpoints kept; -1 = all (an s3:// run keeps none locally)
    save_overwrite: bool = False  # allow a new run to overwrite checkpoints already in save_folder
    autoresume: bool = False  # continue from the last checkpoint in save_folder when there is one
    data_changed_ok: bool = False  # let autoresume continue on data other than the run's data.json records
    progress_bar: bool = True  # Composer's progress bar; False prints one line every log_interval batches
    log_interval: int = 10  # batches between one-line progress logs (when progress_bar=False)
    speed_window: int = 50  # batches averaged by SpeedMonitor for tokens/s and MFU
    algorithms: dict = field(default_factory=dict)  # Composer algorithms by name: {"ema": {"half_life": "1000ba"}}
    callbacks: dict = field(default_factory=dict)  # more callbacks: {"optimizer_monitor": {}, "module.path:Class": {}}
    wandb_log: bool = False  # log to Weights & Biases (pip install wandb; WANDB_API_KEY)
    wandb_project: str = "pile-gpt"  # W&B project
    tensorboard_log: bool = False  # write TensorBoard event files to tensorboard_dir (pip install tensorboard)
    tensorboard_dir: str = "tb_logs/{run_name}"  # TensorBoard folder
    mlflow_log: bool = False  # log to MLflow (pip install mlflow; MLFLOW_TRACKING_URI)
    mlflow_experiment: str = "pile-gpt"  # MLflow experiment name

    def __post_init__(self):
        """Cross-field rules; a ValueError listing every broken one. Model-shape rules live in GPTConfig."""
        from pilegpt.train.extensions import check_algorithms, check_callbacks

        errors = self._check_finite() or (
            self._check_shape() + self._check_data() + self._check_batches() + self._check_optimizer()
            + self._check_schedule() + self._check_eval() + self._check_system() + self._check_save()
            + check_algorithms(self.algorithms, self.grad_clip) + check_callbacks(self.callbacks))
        errors += self._check_float_ranges() if not errors else []
        if errors:
            raise ValueError("; ".join(errors))

    def _check_finite(self) -> list[str]:
        """Every float setting is a finite number (1e999 is inf in Python; nan compares false to every bound)."""
        import math

        return [f"{f.name} must be a finite number, got {getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                if isinstance(getattr(self, f.name), float) and not math.isfinite(getattr(self, f.name))]

    def _check_float_ranges(self) -> list[str]:
        """The float settings that no other rule bounds: each inside the range where it means something."""
        from pilegpt.train.config_bounds import arithmetic_errors

        errors = [f"{k} must be in [0, 1), got {getattr(self, k)}" for k in ("beta1", "beta2")
                  if not 0 <= getattr(self, k) < 1]  # dropout, rope_theta and logit_softcap: GPTConfig's rules
        if self.weight_decay < 0:
            errors.append(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.dist_timeout > 1e6:  # a timedelta for torch.distributed: 1e300 s overflows it
            errors.append(f"dist_timeout must be at most 1e6 seconds (11.6 days), got {self.dist_timeout:g}")
        return errors + arithmetic_errors(self, PART_RATES, MAX_LR)  # qk_scale, rope_theta, rate x decay, ...

    def _check_shape(self) -> list[str]:
        """The model's shape (GPTConfig's rules) and the global batch."""
        errors = []
        try:
            self.model_config()
        except ValueError as e:
            errors.append(str(e).replace("GPTConfig.", ""))
        if self.global_batch_size < 1:
            errors.append(f"global_batch_size must be >= 1, got {self.global_batch_size}")
        return errors + self._check_model_class()

    def _check_model_class(self) -> list[str]:
        """A custom model's import path and arguments, written right (it is imported when the model is built)."""
        module, colon, name = self.model_class.partition(":")
        if self.model_class and not (module and colon and name.isidentifier()):
            return [f"model_class={self.model_class!r} is not an import path: write 'package.module:ClassName' "
                    "(or '' for model.py's GPT)"]
        if self.model_args and not self.model_class:
            return ["model_args are a model_class's constructor arguments, but model_class is '' (model.py's GPT, "
                    "shaped by n_layer, n_head, n_embd, ...): set model_class or drop model_args"]
        if (unsaved := unsaveable(self.model_args)) is not None:
            return [f"model_args={self.model_args!r} cannot be saved in config.json and the checkpoints ({unsaved}): "
                    "use numbers, strings, lists and dicts"]
        if self.model_class and self.init_from != "scratch":
            return [f"init_from={self.init_from} loads weights into model.py's GPT, but model_class="
                    f"{self.model_class} is your own model: it starts from scratch (or continues with autoresume)"]
        return []

    def _check_data(self) -> list[str]:
        """Where the data is (one of data_dir and data_remote) and how it is read."""
        errors = []
        if self.data_format not in ("auto", "bin", "mds"):
            errors.append(f"data_format must be 'auto', 'bin' or 'mds', got {self.data_format!r}")
        if self.data_mix:
            from pilegpt.train.data.mix import check_mix, component_name, plain_weights

            errors += check_mix(self.data_mix)
            self.data_mix = self.data_mix if errors else plain_weights(self.data_mix)
            if self.data_dir is not None or self.data_remote is not None:
                errors.append("data_mix names the data: pass --data_dir=None and --data_remote=None (or drop "
                              "data_mix)")
            taken = set(self.eval_data) & {component_name(r) for r in self.data_mix if isinstance(r, str) and r}
            if taken:
                errors.append(f"eval_data: {sorted(taken)} are data_mix roots' eval set names: choose others")
        elif self.data_dir is None and self.data_remote is None:
            errors.append("no data: set data_dir (a prepare_data or to_mds folder), data_remote (MDS, local or "
                          "s3://) or data_mix (components by weight)")
        if self.data_dir is not None and self.data_remote is not None:
            errors.append(f"both data_dir ({self.data_dir}) and data_remote are set: pass --data_remote=None "
                          "or --data_dir=None")
        if self.data_dir is not None and storage.scheme(self.data_dir):
            errors.append(f"data_dir must be a local folder, got {self.data_dir}: use data_remote for MDS on S3")
        if self.data_remote is not None and self.data_format == "bin":
            errors.append("data_remote is read as MDS: data_format='bin' only works with data_dir")
        if isinstance(self.data_remote, list) and not self.data_remote:
            errors.append("data_remote is an empty list")
        if self.num_workers < 0:
            errors.append(f"num_workers must be >= 0, got {self.num_workers}")
        try:
            from pilegpt.train.data.cache_budget import limit_bytes
            limit_bytes(self.data_cache_limit)
        except ValueError as e:
            errors.append(str(e))
        return errors

    def _check_batches(self) -> list[str]:
        """The per-device batches and the MDS sample order."""
        errors = []
        mb = self.device_train_microbatch_size
        if isinstance(mb, str) and mb != "auto":
            errors.append(f"device_train_microbatch_size must be an integer or 'auto', got {mb!r}")
        if isinstance(mb, int) and mb < 1:
            errors.append(f"device_train_microbatch_size must be >= 1, got {mb}")
        if self.num_canonical_nodes is not None and self.num_canonical_nodes < 1:
            errors.append(f"num_canonical_nodes must be >= 1 (or None), got {self.num_canonical_nodes}")
        if self.device_eval_batch_size is not None and self.device_eval_batch_size < 1:
            errors.append(f"device_eval_batch_size must be >= 1, got {self.device_eval_batch_size}")
        return errors

    def _check_optimizer(self) -> list[str]:
        """The optimizer and its learning rates, the starting weights and gradient clipping."""
        errors = []
        if not 0 < self.learning_rate:
            errors.append(f"learning_rate must be > 0, got {self.learning_rate}")
        elif not 0 <= self.min_lr <= self.learning_rate:
            errors.append(f"min_lr must be in [0, learning_rate={self.learning_rate}], got {self.min_lr}")
        if not self.init_from.strip():
            errors.append("init_from is empty: pass scratch, gpt2, a Hugging Face folder or a pile-gpt checkpoint")
        if self.weight_init not in ("gpt2", "nanochat"):
            errors.append(f"weight_init must be 'gpt2' or 'nanochat', got {self.weight_init!r}")
        elif self.weight_init != "gpt2" and self.init_from != "scratch":
            errors.append(f"weight_init={self.weight_init!r} initialises a new model, but init_from={self.init_from} "
                          "gives the weights: set weight_init='gpt2'")
        if self.grad_clip < 0:
            errors.append(f"grad_clip must be >= 0 (0 = off), got {self.grad_clip}")
        if self.optimizer not in ("adamw", "muon"):
            errors.append(f"optimizer must be 'adamw' or 'muon', got {self.optimizer!r}")
        if not 0 < self.muon_lr:
            errors.append(f"muon_lr must be > 0, got {self.muon_lr}")
        # the optimizers step in float32, where lr / (1 - beta1) past 3.4e38 is a traceback, not a divergence
        errors += [f"{k} must be at most {MAX_LR:g} (a learning rate; AdamW's are ~1e-3, Muon's ~0.02), got "
                   f"{getattr(self, k):g}" for k in ("learning_rate", "muon_lr", *PART_RATES)
                   if getattr(self, k) > MAX_LR]
        errors += self._check_part_rates()
        if self.lr_base_width < 0:
            errors.append(f"lr_base_width must be >= 0 (0 = off; else the width learning_rate is stated for, e.g. "
                          f"128), got {self.lr_base_width}")
        elif self.lr_base_width and self.model_class:
            errors.append(f"lr_base_width={self.lr_base_width} scales AdamW's rates by model.py's n_embd, which "
                          f"model_class={self.model_class} does not use: set lr_base_width=0")
        if not 0 <= self.muon_momentum < 1:
            errors.append(f"muon_momentum must be in [0, 1), got {self.muon_momentum}")
        if self.muon_momentum_warmup < 0:
            errors.append(f"muon_momentum_warmup must be >= 0 optimizer steps (0 = off; modded-nanogpt: 300), got "
                          f"{self.muon_momentum_warmup}")
        errors += self._check_muon_schedules()
        return errors

    def _check_muon_schedules(self) -> list[str]:
        """muon_weight_decay (None or >= 0), and what falls over the run's steps: muon_wd_cosine, and
        muon_momentum_warmdown (a momentum, over lr_schedule="wsd"'s warmdown)."""
        from composer.core import Time, TimeUnit

        errors = []
        if self.muon_weight_decay is not None and self.muon_weight_decay < 0:
            errors.append(f"muon_weight_decay must be >= 0 (or None: weight_decay's), got {self.muon_weight_decay}")
        if not 0 <= self.muon_momentum_warmdown < 1:
            errors.append(f"muon_momentum_warmdown must be in [0, 1) (0 = off; nanochat: 0.9), got "
                          f"{self.muon_momentum_warmdown}")
        elif self.muon_momentum_warmdown and self.lr_schedule != "wsd":
            errors.append(f"muon_momentum_warmdown={self.muon_momentum_warmdown:g} falls over lr_schedule='wsd''s "
                          f"warmdown, which lr_schedule={self.lr_schedule!r} has not: set lr_schedule='wsd' or "
                          "muon_momentum_warmdown=0")
        try:
            unit = Time.from_timestring(self.max_duration).unit
        except (ValueError, TypeError):
            return errors  # _check_schedule names it
        if unit not in (TimeUnit.BATCH, TimeUnit.TOKEN):
            errors += [f"{k}={getattr(self, k)} falls over the run's optimizer steps, which max_duration="
                       f"{self.max_duration!r} does not give: write it in batches ('600ba') or tokens"
                       for k in ("muon_wd_cosine", "muon_momentum_warmdown") if getattr(self, k)]
        return errors

    def max_batches(self) -> int:
        """max_duration in optimizer steps, from batches or tokens (global_batch_size x block_size a step)."""
        from composer.core import Time, TimeUnit

        duration = Time.from_timestring(self.max_duration)
        if duration.unit == TimeUnit.TOKEN:
            return -(-duration.value // (self.global_batch_size * self.block_size))
        return duration.value

    def _check_part_rates(self) -> list[str]:
        """embedding_lr and head_lr: 0 (learning_rate's) or a rate; each names a part of model.py's GPT."""
        if any(getattr(self, k) < 0 for k in PART_RATES):
            return [f"{k} must be >= 0 (0 = learning_rate's), got {getattr(self, k)}" for k in PART_RATES
                    if getattr(self, k) < 0]
        if self.model_class:
            return [f"{k}={getattr(self, k):g} is the rate of a part of model.py's GPT, which model_class="
                    f"{self.model_class} does not have: set {k}=0" for k in PART_RATES if getattr(self, k)]
        if self.head_lr and self.tie_embeddings:
            return [f"head_lr={self.head_lr:g} is for an untied output head, but tie_embeddings=True makes the head "
                    "the token embedding (embedding_lr's): set tie_embeddings=False or head_lr=0"]
        if self.scalar_lr and not (self.x0_scalars or self.smear or self.backout):
            return [f"scalar_lr={self.scalar_lr:g} is the rate of the x0_scalars, smear and backout scalars, but the "
                    "model has none of them: set one of those or scalar_lr=0"]
        return []

    def _check_schedule(self) -> list[str]:
        """The schedule's kind, and the four Composer time strings, a warmup in max_duration's unit."""
        from composer.core import Time, TimeUnit

        from pilegpt.train.optim.schedule import SCHEDULES

        errors, units = [], {}
        if self.lr_schedule not in SCHEDULES:
            errors.append(f"lr_schedule must be one of {', '.join(map(repr, SCHEDULES))}, got {self.lr_schedule!r}")
        if not 0 < self.warmdown <= 1:
            errors.append(f"warmdown must be a fraction of max_duration in (0, 1], got {self.warmdown} "
                          "(lr_schedule='wsd' decays to min_lr over that last part of the run; nanochat: 0.2)")
        for name in ("warmup", "max_duration", "eval_interval", "save_interval"):
            try:
                parsed = Time.from_timestring(getattr(self, name))
            except (ValueError, TypeError) as e:
                errors.append(f"{name}={getattr(self, name)!r} is not a Composer time string like '1000ba', "
                              f"'10000000tok', '1ep' or '0.1dur' ({e})")
                continue
            units[name] = parsed.unit
            if name in ("max_duration", "eval_interval") and parsed.value <= 0:  # 0: no training / no evaluation
                errors.append(f"{name}={getattr(self, name)!r} must be more than 0, e.g. "
                              f"'{'1000ba' if name == 'eval_interval' else '19073ba'}'"
                              + (" (a dataset without a val split trains without evaluation)"
                                 if name == "eval_interval" else ""))
        if units.get("max_duration") == TimeUnit.DURATION:
            errors.append("max_duration cannot be in 'dur' (a fraction of itself)")
        elif "warmup" in units and "max_duration" in units:
            as_batches = {TimeUnit.EPOCH: TimeUnit.BATCH}  # how Composer's scheduler converts epochs
            warm = as_batches.get(units["warmup"], units["warmup"])
            total = as_batches.get(units["max_duration"], units["max_duration"])
            if warm not in (total, TimeUnit.DURATION):
                errors.append(f"warmup ({self.warmup}) must use max_duration's unit ({self.max_duration}) or "
                              f"be a fraction like '0.01dur'")
        return errors

    def _check_eval(self) -> list[str]:
        """Evaluation: the val batches, more eval sets, HellaSwag and the text samples."""
        errors = []
        if self.eval_subset_num_batches == 0 or self.eval_subset_num_batches < -1:
            errors.append(f"eval_subset_num_batches must be -1 (all) or >= 1, got {self.eval_subset_num_batches}")
        for label, location in self.eval_data.items():
            if not (isinstance(label, str) and label.isidentifier()) or label in ("train", "val", "hellaswag"):
                errors.append(f"eval_data: {label!r} is not a usable name: a word like 'owt' (train, val and "
                              "hellaswag are taken)")
            elif not isinstance(location, str) or not location:
                errors.append(f"eval_data: {label}: {location!r} must be a folder or an s3:// MDS root")
        if self.hellaswag_examples < -1:
            errors.append(f"hellaswag_examples must be -1 (all), 0 (off) or a count, got {self.hellaswag_examples}")
        if self.core_examples < -1:
            errors.append(f"core_examples must be -1 (all), 0 (off) or a count per task, got {self.core_examples}")
        if self.sample_length < 0:
            errors.append(f"sample_length must be >= 0, got {self.sample_length}")
        return errors

    def _check_system(self) -> list[str]:
        """The device, the numeric precision and the wait for the job's processes."""
        errors = [f"{k} must be > 0 seconds, got {getattr(self, k)}" for k in ("dist_timeout", "preemption_grace_s")
                  if not getattr(self, k) > 0]
        if self.device not in ("auto", "gpu", "cpu"):
            errors.append(f"device must be 'auto', 'gpu' or 'cpu', got {self.device!r}")
        if self.precision not in ("auto", "fp32", "amp_bf16", "amp_fp16"):
            errors.append(f"precision must be 'auto', 'fp32', 'amp_bf16' or 'amp_fp16', got {self.precision!r}")
        if self.fsdp and self.device_train_microbatch_size == "auto":
            errors.append("device_train_microbatch_size='auto' does not work with fsdp=True (Composer's FSDP2 has no "
                          "automatic microbatching): give an integer, e.g. --device_train_microbatch_size=8")
        if self.activation_checkpointing and self.model_class:
            errors.append(f"activation_checkpointing recomputes model.py's Blocks, which model_class="
                          f"{self.model_class} does not have: set activation_checkpointing=False")
        if isinstance(self.compile, str) and self.compile != "auto":
            errors.append(f"compile must be True, False or 'auto' (on a GPU only), got {self.compile!r}")
        return errors

    def _check_save(self) -> list[str]:
        """save_folder and data_remote as the libraries that read them parse them, autoresume, and the logs."""
        errors = []
        if storage.scheme(self.save_folder) not in ("", "s3"):
            errors.append(f"save_folder={self.save_folder!r}: a local folder or s3://bucket/prefix (any "
                          "S3-compatible store through AWS_ENDPOINT_URL); other stores are not supported")
        remotes = [self.data_remote] if isinstance(self.data_remote, str) else list(self.data_remote or [])
        remotes += [r for r in self.data_mix if isinstance(r, str)]
        for root in remotes:  # Streaming reads a remote root with urlparse too
            if storage.is_remote(root) and storage.read_as_url_elsewhere(root):
                errors.append(f"data_remote {root!r}: Streaming reads it as a URL, where '#', '?' and ';' end the "
                              "path; upload the dataset under a prefix without them")
        folder = self.save_folder.replace("{run_name}", str(self.run_name))
        if storage.read_as_url_elsewhere(folder):
            errors.append(f"save_folder {folder!r}: Composer reads it as a URL, where '#', '?' and ';' end the path "
                          "and 'name:' is a scheme; choose a --save_folder / --run_name without them")
        if self.autoresume and not self.run_name:
            errors.append("autoresume needs a run_name: the name that finds the run's checkpoints again")
        if self.log_interval < 1 or self.speed_window < 1:
            errors.append("log_interval and speed_window must be >= 1")
        return errors

    def adamw_lr(self) -> float:
        """AdamW's peak learning rate for this model: learning_rate, or with lr_base_width the width rule's
        learning_rate x (lr_base_width / n_embd) ** 0.5 (docs/training.md#learning-rates-across-sizes)."""
        return self.learning_rate * self.width_scale()

    def width_scale(self) -> float:
        """lr_base_width's factor on AdamW's rates (1.0 when off, or at the base width itself)."""
        return (self.lr_base_width / self.n_embd) ** 0.5 if self.lr_base_width else 1.0

    def part_scale(self, setting: str) -> float:
        """lr_base_width's factor on a part's rate: the width's for the embeddings and the head, 1 for the scalars."""
        return 1.0 if setting == "scalar_lr" else self.width_scale()

    def width_rule_note(self) -> str:
        """One line saying what lr_base_width made of AdamW's rates (train.py prints it with the config)."""
        b, n, k = self.lr_base_width, self.n_embd, self.width_scale()
        return (f"lr_base_width={b}: learning_rate={self.learning_rate:g} and min_lr={self.min_lr:g} are AdamW's "
                f"rates at n_embd={b}; at n_embd={n}, x ({b}/{n})**0.5 = {k:.4g}: {self.adamw_lr():.4g} and "
                f"{self.min_lr * k:.4g}" + "".join(f"; {p}={getattr(self, p):g}: {getattr(self, p) * k:.4g}"
                                                   for p in PART_RATES if getattr(self, p) and p != "scalar_lr")
                + (f"; Muon's muon_lr={self.muon_lr:g} as set" if self.optimizer == "muon" else ""))

    def unused_muon_note(self) -> str:
        """With optimizer="adamw", one line naming Muon's settings set to other than their defaults (they do nothing
        then: a --optimizer=adamw over config/modern.py, say); "" when there are none."""
        unused = non_defaults(self, MUON_SETTINGS)
        if self.optimizer == "muon" or not unused:
            return ""
        return f"{', '.join(unused)}: Muon's settings, unused with optimizer='adamw' (set optimizer='muon' to use them)"

    def model_config(self):
        from model import GPTConfig

        return GPTConfig(**{name: getattr(self, name) for name in SHAPE_FIELDS}, dropout=self.dropout)

    def initial_gpt(self):
        """model.py's GPT in this shape with a run's initial weights, drawn from torch's generator as the caller seeded
        it (weight_init="nanochat": nanochat's scales); train.py and the plain loop both start here."""
        from model import GPT

        model = GPT(self.model_config())
        if self.weight_init == "nanochat":
            model.nanochat_init()
        return model

    def per_rank_batch(self, world_size: int) -> int:
        """Sequences per process and step. One global batch must split evenly over the processes and into
        whole microbatches, so that 1 or 8 devices train on exactly the same batches; a microbatch larger
        than the per-process batch just means one microbatch."""
        per_rank, mb = self.global_batch_size // world_size, self.device_train_microbatch_size
        if self.global_batch_size % world_size:
            raise UserError(f"global_batch_size ({self.global_batch_size}) must be divisible by the number of "
                            f"processes ({world_size})")
        if isinstance(mb, int) and mb < per_rank and per_rank % mb:
            fits = [d for d in range(1, mb + 1) if per_rank % d == 0]
            raise UserError(f"the per-process batch ({self.global_batch_size} / {world_size} = {per_rank}) must be "
                            f"a multiple of device_train_microbatch_size ({mb}); e.g. {fits[-1]}")
        return per_rank


def unsaveable(value: Any) -> Optional[str]:
    """Why `value` cannot be written as JSON (a set, an object, a cycle), or None when it can."""
    import json

    try:
        json.dumps(value)
    except (TypeError, ValueError) as e:
        return str(e)
    return None


def saved_form(value: Any) -> str:
    """A setting as config.json holds it, as comparable text: a tuple is a list there, a dict key a string."""
    import json

    return json.dumps(json.loads(json.dumps(value)), sort_keys=True)


def used_settings(cfg: TrainConfig) -> dict[str, Any]:
    """The settings the run uses, by name (config.json, the trackers, the start-up lines): with a model_class,
    without model.py's GPT's own (GPT_ONLY_FIELDS), which shape nothing of it."""
    return {k: v for k, v in dataclasses.asdict(cfg).items() if not (cfg.model_class and k in GPT_ONLY_FIELDS)}


def unused_gpt_settings(cfg: TrainConfig) -> list[str]:
    """With a model_class, the GPT_ONLY_FIELDS set to other than their defaults ("n_layer=7"): settings that do
    nothing in this run."""
    return non_defaults(cfg, GPT_ONLY_FIELDS) if cfg.model_class else []


def non_defaults(cfg: TrainConfig, names: tuple[str, ...]) -> list[str]:
    """Those of `names` that cfg sets to other than their defaults, as "name=value"."""
    return [f"{k}={getattr(cfg, k)!r}" for k in names if getattr(cfg, k) != setting_default(k)]


def setting_default(name: str) -> Any:
    """A TrainConfig setting's default (a default_factory's value made anew)."""
    field = TrainConfig.__dataclass_fields__[name]
    return field.default if field.default is not dataclasses.MISSING else field.default_factory()


def config_text(cfg: TrainConfig) -> str:
    settings = used_settings(cfg)
    width = max(len(k) for k in settings)
    return "\n".join(f"  {k:<{width}} = {v!r}" for k, v in settings.items())
