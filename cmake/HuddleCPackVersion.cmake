# CPACK_PROJECT_CONFIG_FILE (cmake/HuddlePackage.cmake): read by cpack at packaging time, so
# that the packages' version names the revision the binaries were built from. That revision is
# the build's generated common/version.cc (cmake/GitVersion.cmake), which `huddle --version`
# prints; the number of commits before it orders the versions of one branch.
file(READ "${CPACK_HUDDLE_VERSION_SOURCE}" version_source)
string(REGEX MATCH "BuildRevision\\(\\) { return \"([^\"]*)\"" matched "${version_source}")
set(revision "${CMAKE_MATCH_1}")
if(revision STREQUAL "" OR revision STREQUAL "unknown")
  set(CPACK_PACKAGE_VERSION "${CPACK_PACKAGE_VERSION}+unknown")
else()
  string(REPLACE "-dirty" "" commit "${revision}")
  execute_process(COMMAND git -C "${CPACK_HUDDLE_SOURCE_DIR}" rev-list --count "${commit}"
    OUTPUT_VARIABLE count RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(NOT rc EQUAL 0)
    set(count 0)
  endif()
  # Debian versions: "-" would start a Debian revision; the revision's "-dirty" becomes ".dirty".
  string(REPLACE "-" "." revision "${revision}")
  set(CPACK_PACKAGE_VERSION "${CPACK_PACKAGE_VERSION}+git${count}.${revision}")
endif()
set(CPACK_DEBIAN_PACKAGE_VERSION "${CPACK_PACKAGE_VERSION}")
