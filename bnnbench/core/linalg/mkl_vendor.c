/* Intel's MKL, which torch's x86-64 wheels link statically for their BLAS and LAPACK, chooses its kernels by the CPU's
   vendor as well as its instruction sets: on a CPU that is not Intel's it takes generic code paths, whatever the CPU
   can do. It asks once, through the dynamic linker, whether the CPU is Intel's, by calling this function; loaded
   globally before torch (mkl_vendor.py, only where BNNBENCH_MKL_ANY_VENDOR is set), this definition answers yes, so
   that MKL dispatches on the instruction sets alone (on an AMD EPYC with AVX-512, 2026-12-03: the UCI steps' float32
   GEMMs 2.1-4.5x faster, Choleskys 1.5-1.6x; bench/mkl_vendor.py). The count of questions says whether MKL asked
   (mkl_vendor.active). */
static long asked;

int mkl_serv_intel_cpu_true(void) {
    asked++;
    return 1;
}

long bnnbench_mkl_asked(void) { return asked; }
