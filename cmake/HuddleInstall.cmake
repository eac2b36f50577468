# `cmake --install build --prefix PREFIX` (docs/deployment.md, "Installing from source"), and
# the Debian packages made from the same rules (cmake/HuddlePackage.cmake: one package per
# component but sdk-dev's, which is libhuddle-client-dev):
#
#   PREFIX/bin/huddle                                   the binary                  (component cli)
#   PREFIX/lib/systemd/system/huddle.service, huddle-agent@.service   its units     (component cli)
#   PREFIX/share/huddle/{grafana,examples}/             dashboard, service examples (component cli)
#   PREFIX/share/doc/huddle/                            README and guides           (component cli)
#   PREFIX/LIBDIR/huddle/libhuddle_cuda.so              its CUDA plugin, if built   (component cuda)
#   PREFIX/LIBDIR/libhuddle_client.so.0.1.0 (+ .so.0)   the client SDK              (component sdk)
#   PREFIX/LIBDIR/libhuddle_client.so                   its link-time name          (component sdk-dev)
#   PREFIX/include/huddle/client/{client,trainer}.h     its public headers          (component sdk-dev)
#   PREFIX/LIBDIR/cmake/Huddle/Huddle{Config,ConfigVersion,Targets*}.cmake         (component sdk-dev)
#   PREFIX/lib/python3/dist-packages/huddle_client*.so  the Python binding          (component python,
#                                                                 client/python/CMakeLists.txt)
#
# (LIBDIR is CMAKE_INSTALL_LIBDIR: lib/x86_64-linux-gnu on Debian.) A consumer writes
# find_package(Huddle 0.1 REQUIRED) and links Huddle::client; see examples/embed_client/.
#
# The CUDA plugin goes to LIBDIR/huddle, where the loader looks relative to the binary after
# looking beside it (kernels/cuda_plugin.h; beside it is the build tree's place, build/cli/). It
# keeps the CUDA toolkit's directory of the build in its RUNPATH (the loader's path,
# LD_LIBRARY_PATH first, still decides on another host).
include(CMakePackageConfigHelpers)

set(HUDDLE_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/Huddle)

install(TARGETS huddle RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT cli)
# The systemd units (deploy/systemd/): lib/systemd/system, where Debian's packages put units
# (/usr/lib/systemd/system under the prefix /usr).
install(FILES ${PROJECT_SOURCE_DIR}/deploy/systemd/huddle.service
  ${PROJECT_SOURCE_DIR}/deploy/systemd/huddle-agent@.service
  DESTINATION lib/systemd/system COMPONENT cli)
install(FILES ${PROJECT_SOURCE_DIR}/deploy/grafana/huddle-service.json
  DESTINATION ${CMAKE_INSTALL_DATADIR}/huddle/grafana COMPONENT cli)
install(FILES ${PROJECT_SOURCE_DIR}/examples/service/job.yaml
  DESTINATION ${CMAKE_INSTALL_DATADIR}/huddle/examples COMPONENT cli)
# The units' Documentation=: the README and the deployment guide.
install(FILES ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/docs/deployment.md
  ${PROJECT_SOURCE_DIR}/docs/security.md ${PROJECT_SOURCE_DIR}/docs/privacy.md
  DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT cli)
if(TARGET huddle_cuda)
  set_target_properties(huddle_cuda PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
  install(TARGETS huddle_cuda LIBRARY DESTINATION ${HUDDLE_INSTALL_PLUGINDIR} COMPONENT cuda)
endif()

install(TARGETS huddle_client_sdk EXPORT HuddleTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT sdk NAMELINK_COMPONENT sdk-dev)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/client/include/huddle
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT sdk-dev
  FILES_MATCHING PATTERN "*.h")
install(EXPORT HuddleTargets NAMESPACE Huddle:: FILE HuddleTargets.cmake
  DESTINATION ${HUDDLE_INSTALL_CMAKEDIR} COMPONENT sdk-dev)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/HuddleConfig.cmake.in
  ${PROJECT_BINARY_DIR}/HuddleConfig.cmake
  INSTALL_DESTINATION ${HUDDLE_INSTALL_CMAKEDIR}
  NO_SET_AND_CHECK_MACRO)
# 0.x: every 0.y release may be asked for as 0.1; the SONAME (libhuddle_client.so.0) follows the
# major version too.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/HuddleConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/HuddleConfig.cmake ${PROJECT_BINARY_DIR}/HuddleConfigVersion.cmake
  DESTINATION ${HUDDLE_INSTALL_CMAKEDIR} COMPONENT sdk-dev)
