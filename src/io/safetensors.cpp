// placeholder: the safetensors reader/writer
