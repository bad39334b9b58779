"""Installs mindspore_ngd: natural-gradient (K-FAC family) optimizers for MindSpore."""
from setuptools import find_packages, setup

setup(
    name="mindspore_ngd",
    version="0.2.0",
    description="K-FAC, SP-NGD and THOR-style natural-gradient optimizers as MindSpore nn.Optimizer cells",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    # the library only: benchmarks/ (and the demo in it), model_zoo/ and tests/ stay in the repository
    # and run from its root (python -m benchmarks.demo); the extras below are their dependencies
    packages=find_packages(include=["mindspore_ngd", "mindspore_ngd.*"]),
    # MindSpore 2.10's compiled extension is built against NumPy 1.x: under NumPy 2 the first
    # PyNative op of a process fails ("numpy.core.multiarray failed to import") and
    # mindspore.dataset rejects NumPy scalars. NumPy 1.26 has neither problem.
    install_requires=["mindspore>=2.3", "numpy>=1.25,<2"],
    extras_require={
        # the quick-start demo (python -m benchmarks.demo) trains on scikit-learn's bundled digits data
        "examples": ["scikit-learn"],
        # model_zoo/resnet50 reads YAML configs
        "model_zoo": ["pyyaml"],
        # every benchmark, including the time-to-accuracy suite (python -m benchmarks.convergence):
        # digits and MNIST-1D data, plots
        "bench": ["scikit-learn", "matplotlib", "mnist1d"],
        # the tests cover the library, the benchmarks and the model zoo; pytest-xdist runs them on
        # two processes (pytest.ini)
        "test": ["pytest", "pytest-xdist>=3.6", "scipy", "scikit-learn", "pyyaml", "matplotlib", "mnist1d"],
    },
    license="Apache-2.0",
)
