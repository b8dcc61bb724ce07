module example.com/passcount

go 1.26.8

require github.com/kiln-compiler/kiln v0.0.0

require (
	github.com/alecthomas/participle/v2 v2.1.4 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

replace github.com/kiln-compiler/kiln => ../..
