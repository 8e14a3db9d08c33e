# fuzz.cmake — the libFuzzer harnesses (REGC_FUZZ=ON; `cmake --preset fuzz`).
#
# Every tests/fuzz/fuzz_<name>.c defines LLVMFuzzerTestOneInput and becomes
# the target fuzz_<name>; its seeds are tests/fuzz/corpus/<name>/, and
# tools/fuzz.sh runs them all. The library is rebuilt here from its sources
# with coverage for libFuzzer and ASan + UBSan (aborting on the first
# report), without the CPU and CUDA backends: the parsers never run a kernel,
# and leaving kernels/cpu out leaves out OpenMP, whose clang runtime (libomp)
# would be one more package for nothing (tests/fuzz/stub_backend.c stands in
# for the CPU backend's entry points).
if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "REGC_FUZZ=ON needs clang for libFuzzer (cmake --preset fuzz, or "
                      "-DCMAKE_C_COMPILER=clang)")
endif()

find_package(Threads REQUIRED)
find_path(CJSON_INCLUDE_DIR cjson/cJSON.h REQUIRED)
find_library(CJSON_LIBRARY cjson REQUIRED)
find_library(M_LIBRARY m)
find_package(ZLIB REQUIRED)
find_path(XXHASH_INCLUDE_DIR xxhash.h REQUIRED)
find_library(XXHASH_LIBRARY xxhash REQUIRED)

# the library's folders but the backends' (kernels/cpu, kernels/cuda)
regc_glob_sources(REGC_FUZZ_SOURCES REGC_FUZZ_HEADERS ${REGC_FOLDERS})
# the same build identity header as the library's (cache/ keys entries with it)
regc_source_id_header(REGC_SOURCE_ID_H REGC_FUZZ_SOURCES REGC_FUZZ_HEADERS)

set(REGC_FUZZ_SANITIZE address,undefined)
set(REGC_FUZZ_FLAGS -fno-sanitize-recover=all -fno-omit-frame-pointer -g -O1)
add_library(regc_fuzz STATIC ${REGC_FUZZ_SOURCES} tests/fuzz/stub_backend.c ${REGC_SOURCE_ID_H})
target_include_directories(regc_fuzz PUBLIC ${REGC_FOLDERS}
                           ${CJSON_INCLUDE_DIR})
target_include_directories(regc_fuzz PRIVATE ${XXHASH_INCLUDE_DIR} ${CMAKE_BINARY_DIR}/generated)
target_compile_options(regc_fuzz PRIVATE -fsanitize=fuzzer-no-link,${REGC_FUZZ_SANITIZE}
                       ${REGC_FUZZ_FLAGS})
target_link_libraries(regc_fuzz PUBLIC ${CJSON_LIBRARY} ${M_LIBRARY} ${XXHASH_LIBRARY} ZLIB::ZLIB
                      Threads::Threads)

file(GLOB REGC_FUZZ_HARNESSES CONFIGURE_DEPENDS tests/fuzz/fuzz_*.c)
foreach(src ${REGC_FUZZ_HARNESSES})
  get_filename_component(name ${src} NAME_WE)
  add_executable(${name} ${src})
  target_compile_options(${name} PRIVATE -fsanitize=fuzzer,${REGC_FUZZ_SANITIZE} ${REGC_FUZZ_FLAGS})
  target_link_options(${name} PRIVATE -fsanitize=fuzzer,${REGC_FUZZ_SANITIZE})
  target_link_libraries(${name} PRIVATE regc_fuzz)
endforeach()
message(STATUS "regc: fuzz harnesses only (REGC_FUZZ=ON)")
