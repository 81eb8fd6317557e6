"""Perseus: energy-bloat removal for pipeline-parallel training (Megatron-LM, DeepSpeed, torch.distributed.pipelining)."""

from pathlib import Path

from setuptools import find_packages, setup

setup(
    name="perseus-energy",
    version="0.1.0",
    description="Per-instruction GPU frequency planning that removes energy bloat from pipeline-parallel training",
    long_description=Path(__file__).with_name("README.md").read_text() if Path("README.md").exists() else "",
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
        "nvidia-ml-py>=12.0",
        "matplotlib>=3.6",
        "tqdm>=4.60",
        # perseus report's page: a template with autoescaping (perseus/output/templates/report.html.j2)
        "jinja2>=3.1",
    ],
    # megatron-core 0.17+ declare Requires-Python >= 3.12, so on Python 3.11 this resolves to 0.16.1.
    extras_require={
        # six, regex, pyyaml: Megatron-LM's training code (pretrain_gpt.py, perseus demo --megatron-lm)
        # imports them, and the megatron-core wheel does not bring them
        "megatron": ["torch>=2.1", "megatron-core>=0.16,<0.20", "six", "regex", "pyyaml"],
        "deepspeed": ["torch>=2.1", "deepspeed>=0.19,<0.20"],
        "torch": ["torch>=2.13"],
        "bench": ["lowtime==0.3.0"],
        # start_http_server returns its server (so it can be closed) from 0.20 on
        "prometheus": ["prometheus-client>=0.20"],
        # the zeusd backend (perseus/gpu/zeusd/client.py): HTTP over zeusd's Unix socket
        "zeusd": ["httpx>=0.27"],
        # carbon-intensity endpoints (ElectricityMaps, WattTime) over HTTP: perseus/carbon/signals.py. Zeus's
        # CarbonIntensityProvider objects are taken by their method, so zeus itself is not required
        "carbon": ["httpx>=0.27"],
        # pytest-xdist: pytest.ini runs the suite on 2 workers (most tests wait on simulated GPUs)
        "dev": ["pytest>=8", "pytest-xdist>=3.5", "torch>=2.1", "megatron-core>=0.16,<0.20", "six", "regex", "pyyaml",
                "deepspeed>=0.19,<0.20",
                "prometheus-client>=0.20", "httpx>=0.27",
                # tests read the event files Megatron's and DeepSpeed's TensorBoard writers produce
                "tensorboard>=2.14",
                # scripts/test_all.sh runs both before the suite (ruff.toml, mypy.ini; pinned in constraints.txt)
                "ruff>=0.17", "mypy>=2.4"],
    },
    entry_points={
        "console_scripts": ["perseus=perseus.cli:main"],
        "perseus.commands": ["demo=perseus_demo.cli:add_demo_command"],
    },
)
