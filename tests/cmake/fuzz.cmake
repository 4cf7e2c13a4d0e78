# Registers one ctest entry per libFuzzer target: runs build-fuzz/<name> (built by
# scripts/build_fuzz.sh) for FUZZ_SECONDS (default 30) over its seed corpus. Skipped
# (exit 77) when the fuzz build is absent, e.g. a plain developer build.
file(GLOB _fuzz_sources CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/fuzz/fuzz_*.cpp)
foreach(_src ${_fuzz_sources})
  get_filename_component(_name ${_src} NAME_WE)
  add_test(NAME fuzz.${_name}
    COMMAND bash ${CMAKE_SOURCE_DIR}/scripts/run_fuzz_target.sh ${_name})
  set_tests_properties(fuzz.${_name} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)
endforeach()
