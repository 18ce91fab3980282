// Where a tensor lives. The type is ready for CUDA; only the CPU backend exists so far.
#pragma once

#include <cstdint>
#include <string>

namespace mantissa {

enum class DeviceType : uint8_t { CPU, CUDA };
inline constexpr int kNumDeviceTypes = 2;

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static constexpr Device cpu() { return {DeviceType::CPU, 0}; }
  static constexpr Device cuda(int index = 0) { return {DeviceType::CUDA, index}; }

  constexpr bool is_cpu() const { return type == DeviceType::CPU; }
  constexpr bool is_cuda() const { return type == DeviceType::CUDA; }
  friend constexpr bool operator==(Device a, Device b) = default;
  std::string str() const;  // "cpu", "cuda:0"
};

// "cpu", "cuda", "cuda:1"; throws mantissa::Error naming the accepted forms otherwise.
Device parse_device(const std::string& text);

}  // namespace mantissa
