# library_sources.cmake — the library's sources and the header that names
# their build, shared by the library (CMakeLists.txt) and the fuzz build
# (cmake/fuzz.cmake).

# Every .c and .h of the folders after the two names into SOURCES_VAR and
# HEADERS_VAR; the CUDA module's own sources (zero3/comm_nccl.c,
# zero3/cuda_module.c) are never the library's.
function(regc_glob_sources sources_var headers_var)
  set(sources "")
  set(headers "")
  foreach(dir ${ARGN})
    file(GLOB dir_sources CONFIGURE_DEPENDS ${dir}/*.c)
    file(GLOB dir_headers CONFIGURE_DEPENDS ${dir}/*.h)
    list(APPEND sources ${dir_sources})
    list(APPEND headers ${dir_headers})
  endforeach()
  list(FILTER sources EXCLUDE REGEX "zero3/(comm_nccl|cuda_module)\\.c$")
  set(${sources_var} ${sources} PARENT_SCOPE)
  set(${headers_var} ${headers} PARENT_SCOPE)
endfunction()

# The build's identity for compile-cache keys, generated/regc_source_id.h:
# a hash of every source and header named (two list variables' names),
# remade whenever one changes. Its path into OUT_VAR.
function(regc_source_id_header out_var sources_var headers_var)
  set(header ${CMAKE_BINARY_DIR}/generated/regc_source_id.h)
  set(list_file ${CMAKE_BINARY_DIR}/generated/regc_sources.txt)
  string(REPLACE ";" "\n" lines "${${sources_var}};${${headers_var}}")
  file(WRITE ${list_file} "${lines}\n")
  add_custom_command(OUTPUT ${header}
    COMMAND ${CMAKE_COMMAND} -DOUT=${header} -DVERSION=${PROJECT_VERSION}
            -DLIST=${list_file} -P ${CMAKE_SOURCE_DIR}/cmake/source_id.cmake
    DEPENDS ${${sources_var}} ${${headers_var}} ${CMAKE_SOURCE_DIR}/cmake/source_id.cmake
    COMMENT "Hashing the library sources for compile-cache keys")
  set(${out_var} ${header} PARENT_SCOPE)
endfunction()
