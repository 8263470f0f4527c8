# scape_library(NAME SOURCES file... [LINK target...] [NO_FP_CONTRACT]): one folder's static
# library, seen from the repository root (#include "folder/file.hpp"), warnings on; LINK are its
# public dependencies, the layers below it (docs/ARCHITECTURE.md). NO_FP_CONTRACT for optimizer
# arithmetic, which rounds the same on every ISA and in the CUDA kernels (cmake/isa.cmake).
function(scape_library name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "NO_FP_CONTRACT" "" "SOURCES;LINK")
  add_library(${name} STATIC ${arg_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PUBLIC ${arg_LINK} PRIVATE scape_warnings)
  if(arg_NO_FP_CONTRACT)
    target_compile_options(${name} PRIVATE ${SCAPE_NO_FP_CONTRACT})
  endif()
endfunction()
