# VCUDNN_SANITIZE: build every target (library, tools, tests) under sanitizers, e.g. `thread` (what
# CI runs) or `address,undefined`. Compile and link both get the flags, so that the runtimes are
# linked into libvcudnn.so and every executable.
set(VCUDNN_SANITIZE "" CACHE STRING "sanitizers for every target: thread, address, undefined or address,undefined")
if(NOT VCUDNN_SANITIZE)
  return()
endif()
string(REPLACE "," ";" _sanitizers "${VCUDNN_SANITIZE}")
foreach(_s IN LISTS _sanitizers)
  if(NOT _s MATCHES "^(thread|address|undefined)$")
    message(FATAL_ERROR "VCUDNN_SANITIZE: unknown sanitizer '${_s}' (thread, address, undefined)")
  endif()
endforeach()
if("thread" IN_LIST _sanitizers AND "address" IN_LIST _sanitizers)
  message(FATAL_ERROR "VCUDNN_SANITIZE: thread and address cannot be combined")
endif()
# Frame pointers give the reports full stacks; undefined behaviour stops the test that hit it
# instead of printing a line that nobody reads.
set(_flags -fsanitize=${VCUDNN_SANITIZE} -fno-omit-frame-pointer)
if("undefined" IN_LIST _sanitizers)
  list(APPEND _flags -fno-sanitize-recover=undefined)
endif()
add_compile_options(${_flags})
add_link_options(-fsanitize=${VCUDNN_SANITIZE})
message(STATUS "sanitizers: ${VCUDNN_SANITIZE}")
