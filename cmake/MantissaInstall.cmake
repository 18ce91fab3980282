# `cmake --install`: the library, its headers, the CLI, a CMake package (find_package(mantissa
# CONFIG) -> mantissa::mantissa) and a pkg-config file; `cpack -G DEB`: the same as a Debian
# package. Included from the top-level CMakeLists.txt once the targets exist. docs/building.md
# ("Using Mantissa from C++") and examples/ show the consumer's side; scripts/package-check tests
# it end to end.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(MANTISSA_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/mantissa)

install(TARGETS mantissa EXPORT mantissaTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS mantissa_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES ${PROJECT_SOURCE_DIR}/tools/study_report.py DESTINATION ${CMAKE_INSTALL_DATADIR}/mantissa)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/mantissa DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
install(EXPORT mantissaTargets NAMESPACE mantissa:: DESTINATION ${MANTISSA_CMAKE_DIR})

# ---- the CMake package ----------------------------------------------------------------------
# Where the libraries found by path were, as hints for the config's own search.
get_filename_component(MANTISSA_DNNL_DIR "${DNNL_LIBRARY}" DIRECTORY)
set(MANTISSA_CUDNN_DIR "")
set(MANTISSA_CUDNN_NAMES "cudnn")
set(MANTISSA_NCCL_DIR "")
if(MANTISSA_HAS_CUDA)
  get_filename_component(MANTISSA_CUDNN_DIR "${CUDNN_LIBRARY}" DIRECTORY)
  get_filename_component(cudnn_name "${CUDNN_LIBRARY}" NAME)
  list(APPEND MANTISSA_CUDNN_NAMES ${cudnn_name})  # e.g. libcudnn.so.9 (pip wheels: no .so)
endif()
if(MANTISSA_HAS_NCCL)
  get_filename_component(MANTISSA_NCCL_DIR "${NCCL_LIBRARY}" DIRECTORY)
endif()
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/mantissaConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/mantissaConfig.cmake
                              INSTALL_DESTINATION ${MANTISSA_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/mantissaConfigVersion.cmake
                                 COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/mantissaConfig.cmake
              ${PROJECT_BINARY_DIR}/mantissaConfigVersion.cmake
        DESTINATION ${MANTISSA_CMAKE_DIR})

# ---- pkg-config -----------------------------------------------------------------------------
# Each library the static archive needs, as linker flags: -L<dir> once per directory the linker
# does not search anyway, and -l<name>, or -l:<file> for a versioned file name only
# (libcudnn.so.9).
set(pc_dirs "")
set(pc_names "")
function(mantissa_pc_library path)
  get_filename_component(dir "${path}" DIRECTORY)
  get_filename_component(file "${path}" NAME)
  if(NOT dir IN_LIST CMAKE_CXX_IMPLICIT_LINK_DIRECTORIES AND NOT "-L${dir}" IN_LIST pc_dirs)
    set(pc_dirs ${pc_dirs} "-L${dir}" PARENT_SCOPE)
  endif()
  if(file MATCHES "^lib(.+)\\.(so|a)$")
    set(pc_names ${pc_names} "-l${CMAKE_MATCH_1}" PARENT_SCOPE)
  else()
    set(pc_names ${pc_names} "-l:${file}" PARENT_SCOPE)
  endif()
endfunction()
set(pc_defines "")
mantissa_pc_library("${DNNL_LIBRARY}")
foreach(lib IN LISTS ZLIB_LIBRARIES)
  mantissa_pc_library("${lib}")
endforeach()
if(MANTISSA_HAS_MPI)
  foreach(lib IN LISTS MPI_CXX_LIBRARIES)
    mantissa_pc_library("${lib}")
  endforeach()
  list(APPEND pc_defines -DMANTISSA_HAS_MPI=1)
endif()
if(MANTISSA_HAS_CUDA)
  foreach(lib IN ITEMS "${CUDNN_LIBRARY}" "${CUDA_cublasLt_LIBRARY}" "${CUDA_cudart_LIBRARY}")
    mantissa_pc_library("${lib}")
  endforeach()
  list(APPEND pc_defines -DMANTISSA_HAS_CUDA=1)
endif()
if(MANTISSA_HAS_NCCL)
  mantissa_pc_library("${NCCL_LIBRARY}")
  list(APPEND pc_defines -DMANTISSA_HAS_NCCL=1)
endif()
# -fopenmp: compiles (OpenMP::OpenMP_CXX is public) and links libgomp
list(JOIN OpenMP_CXX_FLAGS " " pc_openmp)
list(JOIN pc_defines " " pc_defines)
list(JOIN pc_dirs " " pc_dirs)
list(JOIN pc_names " " pc_names)
set(MANTISSA_PC_CFLAGS "${pc_openmp} ${pc_defines}")
get_target_property(mantissa_type mantissa TYPE)
if(mantissa_type STREQUAL "STATIC_LIBRARY")
  # A static library's dependencies are the consumer's to link: `pkg-config --libs` gives them.
  set(MANTISSA_PC_LIBS "${pc_openmp} ${pc_dirs} ${pc_names}")
  set(MANTISSA_PC_LIBS_PRIVATE "")
else()
  set(MANTISSA_PC_LIBS "${pc_openmp}")
  set(MANTISSA_PC_LIBS_PRIVATE "${pc_dirs} ${pc_names}")
endif()
string(STRIP "${MANTISSA_PC_CFLAGS}" MANTISSA_PC_CFLAGS)
string(STRIP "${MANTISSA_PC_LIBS}" MANTISSA_PC_LIBS)
string(STRIP "${MANTISSA_PC_LIBS_PRIVATE}" MANTISSA_PC_LIBS_PRIVATE)
# prefix relative to the .pc file, so an installed tree (or the .deb's /usr) can move.
file(RELATIVE_PATH MANTISSA_PC_PREFIX_FROM_PCDIR "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
string(REGEX REPLACE "/$" "" MANTISSA_PC_PREFIX_FROM_PCDIR "${MANTISSA_PC_PREFIX_FROM_PCDIR}")
configure_file(${CMAKE_CURRENT_LIST_DIR}/mantissa.pc.in ${PROJECT_BINARY_DIR}/mantissa.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/mantissa.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# ---- cpack -G DEB ---------------------------------------------------------------------------
# The Debian package's dependencies: the packages that own the libraries linked above (so an
# OpenMPI build depends on libopenmpi-dev, a CUDA toolkit installed from .debs on its packages);
# a library no package owns (a CUDA toolkit from the runfile, pip's cuDNN) is only reported.
set(deb_depends "")
find_program(MANTISSA_DPKG_QUERY dpkg-query)
if(MANTISSA_DPKG_QUERY)
  set(deb_libs "${DNNL_LIBRARY}" ${ZLIB_LIBRARIES})
  # libgomp's development link (-fopenmp): in the compiler's libgcc-N-dev
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libgomp.so
                  OUTPUT_VARIABLE gomp OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(gomp AND EXISTS "${gomp}")
    list(APPEND deb_libs "${gomp}")
  endif()
  if(MANTISSA_HAS_MPI)
    list(APPEND deb_libs ${MPI_CXX_LIBRARIES})
  endif()
  if(MANTISSA_HAS_CUDA)
    list(APPEND deb_libs "${CUDNN_LIBRARY}" "${CUDA_cublasLt_LIBRARY}" "${CUDA_cudart_LIBRARY}")
  endif()
  if(MANTISSA_HAS_NCCL)
    list(APPEND deb_libs "${NCCL_LIBRARY}")
  endif()
  foreach(lib IN LISTS deb_libs)
    file(REAL_PATH "${lib}" real)
    set(owner "")
    foreach(p IN ITEMS "${lib}" "${real}")  # the -dev symlink's owner first, then the file's
      execute_process(COMMAND ${MANTISSA_DPKG_QUERY} -S "${p}" OUTPUT_VARIABLE out
                      RESULT_VARIABLE rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
      if(rc EQUAL 0 AND out MATCHES "^([^:, ]+)")
        set(owner ${CMAKE_MATCH_1})
        break()
      endif()
    endforeach()
    if(owner)
      list(APPEND deb_depends ${owner})
    else()
      message(STATUS "Mantissa .deb: no Debian package owns ${lib}; not a dependency")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES deb_depends)
endif()
list(JOIN deb_depends ", " CPACK_DEBIAN_PACKAGE_DEPENDS)

set(CPACK_PACKAGE_NAME mantissa)
set(CPACK_PACKAGE_VENDOR "Mantissa")
set(CPACK_PACKAGE_CONTACT "Mantissa developers <mantissa@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "Mixed-precision training engine: C++20 static library, headers, CMake package and CLI")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # mantissa_0.1.0_amd64.deb
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_PACKAGE_DESCRIPTION
    "The static library libmantissa.a with its headers, a CMake package (find_package(mantissa \
CONFIG), target mantissa::mantissa), a pkg-config file (mantissa.pc) and the mantissa \
command-line tool.")
if(NOT CPACK_GENERATOR)
  set(CPACK_GENERATOR DEB)
endif()
include(CPack)
message(STATUS "Mantissa: .deb depends on: ${CPACK_DEBIAN_PACKAGE_DEPENDS}")
