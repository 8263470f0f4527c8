# The instruction set the CPU code is compiled for (SCAPE_ISA). The model's GEMMs run about 2.5x
# faster with AVX2+FMA (x86-64-v3) than with the x86-64-v2 baseline, so `auto` builds for v3
# whenever the build host runs it and falls back to the portable v2 otherwise. The optimizer's
# translation units are compiled with -ffp-contract=off (kernels/ and core/), so their results do
# not depend on this choice: see docs/CONTRIBUTING.md, "Instruction set and floating point".
set(SCAPE_ISA "auto" CACHE STRING
    "CPU instruction set: auto (x86-64-v3 if the build host runs it, else x86-64-v2), native, x86-64-v3, x86-64-v2, or default (the compiler's own)")
set_property(CACHE SCAPE_ISA PROPERTY STRINGS auto native x86-64-v3 x86-64-v2 default)

set(scape_isa_flag "")
if(SCAPE_ISA STREQUAL "auto")
  if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$" AND NOT CMAKE_CROSSCOMPILING)
    try_run(scape_isa_run scape_isa_compiled
            SOURCES ${CMAKE_CURRENT_LIST_DIR}/host_has_x86_64_v3.cpp)
    if(scape_isa_compiled AND scape_isa_run EQUAL 0)
      set(scape_isa_flag "-march=x86-64-v3")
    else()
      set(scape_isa_flag "-march=x86-64-v2")
    endif()
  endif()
  # Other architectures (e.g. Grace, aarch64) keep the compiler's default; pass native there.
elseif(SCAPE_ISA STREQUAL "native")
  set(scape_isa_flag "-march=native")
elseif(SCAPE_ISA MATCHES "^x86-64-v[234]$")
  set(scape_isa_flag "-march=${SCAPE_ISA}")
elseif(NOT SCAPE_ISA STREQUAL "default")
  message(FATAL_ERROR "SCAPE_ISA=${SCAPE_ISA}: expected auto, native, x86-64-v3, x86-64-v2 or default")
endif()

# Debug builds (sanitizers, -O0) keep the compiler's default: speed does not matter there.
if(scape_isa_flag AND NOT CMAKE_BUILD_TYPE STREQUAL "Debug")
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:${scape_isa_flag}>)
  message(STATUS "scape: CPU code built with ${scape_isa_flag} (SCAPE_ISA=${SCAPE_ISA})")
else()
  message(STATUS "scape: CPU code built for the compiler's default instruction set (SCAPE_ISA=${SCAPE_ISA})")
endif()

# For the optimizer's translation units: no a*b+c contraction into FMA, so every ISA (and the CUDA
# kernels, built with --fmad=false) rounds the same way and results stay bit-identical.
set(SCAPE_NO_FP_CONTRACT $<$<COMPILE_LANGUAGE:CXX>:-ffp-contract=off>)
