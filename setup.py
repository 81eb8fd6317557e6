"""Perseus: energy-bloat removal for pipeline-parallel training (Megatron-LM, DeepSpeed, torch.distributed.pipelining)."""

from pathlib import Path

from setuptools import find_packages, setup

README = Path(__file__).with_name("README.md")

setup(
    name="perseus-energy",
    version="0.1.0",
    description="Per-instruction GPU frequency planning that removes energy bloat from pipeline-parallel training",
    long_description=README.read_text() if README.exists() else "",
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["perseus", "perseus.*", "perseus_megatron", "perseus_megatron.*", "perseus_deepspeed",
                                    "perseus_deepspeed.*", "perseus_torch", "perseus_torch.*", "perseus_demo",
                                    "perseus_demo.*"]),
    package_data={"perseus.examples": ["*.csv"], "perseus.output": ["templates/*.j2"]},
    install_requires=[
        "numpy>=1.24",
        "scipy>=1.10",
        "highspy>=1.7",
        # the planner's network simplex (planner/network_simplex.py) is compiled by numba
        "numba>=0.60",
        "pydantic>=2.0",
        "matplotlib>=3.6",
        "tqdm>=4.60",
        # perseus report's page: a template with autoescaping (perseus/output/templates/report.html.j2)
        "jinja2>=3.1",
    ],
    # NVML's Python binding is the ``gpu`` extra: the base install brings no nvidia-* package.
    # The framework packages (torch, megatron-core, deepspeed) and NVML's binding carry lower bounds only:
    # installing Perseus into a CUDA container never downgrades or replaces what the container ships.
    # The adapters check the installed versions at start and name what is not supported in one line.
    # The versions the tests run (pins, upper bounds) are in the ``dev`` extra and constraints.txt.
    extras_require={
        # six, regex, pyyaml: Megatron-LM's training code (pretrain_gpt.py, perseus demo --megatron-lm)
        # imports them, and the megatron-core wheel does not bring them
        "megatron": ["torch>=2.1", "megatron-core>=0.16", "six", "regex", "pyyaml"],
        "deepspeed": ["torch>=2.1", "deepspeed>=0.19"],
        "torch": ["torch>=2.13"],
        # TorchTitan's own trainer with a perseus section (perseus_torch/torchtitan.py); torchtitan.trainer also
        # imports triton, which CUDA builds of torch bring and CPU builds do not
        "torchtitan": ["torch>=2.13", "torchtitan>=0.3"],
        # NVML's Python binding (imported as pynvml), for real GPUs: pip install "perseus-energy[gpu]"
        "gpu": ["nvidia-ml-py>=12.0"],
        # the documentation site: mkdocs build --strict (mkdocs.yml)
        "docs": ["mkdocs-material>=9.5"],
        "bench": ["lowtime==0.3.0"],
        # start_http_server returns its server (so it can be closed) from 0.20 on
        "prometheus": ["prometheus-client>=0.20"],
        # the zeusd backend (perseus/gpu/zeusd/client.py): HTTP over zeusd's Unix socket
        "zeusd": ["httpx>=0.27"],
        # carbon-intensity endpoints (ElectricityMaps, WattTime) over HTTP: perseus/carbon/signals.py. Zeus's
        # CarbonIntensityProvider objects are taken by their method, so zeus itself is not required
        "carbon": ["httpx>=0.27"],
        # pytest-xdist: pytest.ini runs the suite on 2 workers (most tests wait on simulated GPUs).
        # megatron-core 0.17+ declare Requires-Python >= 3.12, so on Python 3.11 this resolves to 0.16.1.
        "dev": ["pytest>=8", "pytest-xdist>=3.5", "torch>=2.1", "megatron-core>=0.16,<0.20", "six", "regex", "pyyaml",
                "deepspeed>=0.19,<0.20",
                "prometheus-client>=0.20", "httpx>=0.27",
                # tests read the event files Megatron's and DeepSpeed's TensorBoard writers produce
                "tensorboard>=2.14",
                # scripts/test_all.sh runs both before the suite (ruff.toml, mypy.ini; pinned in constraints.txt)
                "ruff>=0.17", "mypy>=2.4",
                # the NVML paths' tests (a fake pynvml module stands in for the driver) and the docs build
                "nvidia-ml-py>=12.0", "mkdocs-material>=9.5"],
    },
    entry_points={
        "console_scripts": ["perseus=perseus.cli:main"],
        "perseus.commands": ["demo=perseus_demo.cli:add_demo_command"],
    },
)
