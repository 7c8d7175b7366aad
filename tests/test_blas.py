"""What a benchmark says of the BLAS it ran on (coordinator_free.blas.kernels_in_use)."""

from __future__ import annotations

import os

from freshpy import run_fresh

from coordinator_free.blas import describe_kernels
from coordinator_free.net.channel import cpu_flags

NUMPY_OPENBLAS = {
    "user_api": "blas",
    "internal_api": "openblas",
    "version": "0.3.31",
    "architecture": "Haswell",
}


def test_each_blas_is_named_once_with_its_kernels():
    scipy_openblas = {**NUMPY_OPENBLAS, "version": "0.3.30"}
    openmp = {"user_api": "openmp", "internal_api": "openmp", "version": None}
    libs = [NUMPY_OPENBLAS, openmp, scipy_openblas, dict(NUMPY_OPENBLAS)]
    assert describe_kernels(libs, None) == "openblas 0.3.30 Haswell, openblas 0.3.31 Haswell"


def test_a_chosen_coretype_is_said():
    text = describe_kernels([NUMPY_OPENBLAS], "Haswell")
    assert text == "openblas 0.3.31 Haswell (kernels chosen by OPENBLAS_CORETYPE=Haswell)"
    assert describe_kernels([NUMPY_OPENBLAS], "") == "openblas 0.3.31 Haswell"


def test_missing_fields_and_no_blas_are_said_plainly():
    bare = {"user_api": "blas", "internal_api": None, "version": None, "architecture": None}
    assert describe_kernels([bare], None) == "blas of unknown version kernels unknown"
    assert describe_kernels([], "SkylakeX") == (
        "no BLAS loaded (kernels chosen by OPENBLAS_CORETYPE=SkylakeX)"
    )


def test_the_kernels_a_coretype_chooses_are_those_reported():
    # A real interpreter: OpenBLAS reads OPENBLAS_CORETYPE when it loads. Sandybridge's (AVX)
    # kernels run on every x86-64 CPU this project runs on with AVX; on another CPU OpenBLAS
    # ignores the name and the report says what it chose instead, so only the suffix is certain.
    code = (
        "import numpy, scipy.linalg\n"
        "from coordinator_free import blas\n"
        "print(blas.kernels_in_use())\n"
    )
    text = run_fresh(code, {**os.environ, "OPENBLAS_CORETYPE": "Sandybridge"})
    assert text.endswith("(kernels chosen by OPENBLAS_CORETYPE=Sandybridge)"), text
    assert text.startswith("openblas "), text
    if "avx" in cpu_flags():
        assert text.count("Sandybridge") >= 2, text  # every library loaded, and the variable
