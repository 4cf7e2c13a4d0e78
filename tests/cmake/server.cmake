# End-to-end tests of `dsinfer serve` (tests/server/): each starts the built server on a
# free loopback port with the embedded model set and drives it with node: the official
# openai npm client, malformed requests, a 128-client load test (also with async prefetch), hot reload, SIGTERM
# draining, `promtool check metrics`, non-streaming disconnects, --log-dflash-details and the
# --enable-metrics / --enable-health-check switches. Skipped (77) without node / promtool.
foreach(_t openai_client errors load load_async hot_reload sigterm promtool disconnect dflash_log endpoint_flags)
  add_test(NAME server.${_t}
    COMMAND bash ${CMAKE_SOURCE_DIR}/tests/server/run_server_test.sh ${_t} $<TARGET_FILE:dsinfer>)
  set_tests_properties(server.${_t} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
endforeach()
set_tests_properties(server.load server.load_async PROPERTIES RUN_SERIAL TRUE)
