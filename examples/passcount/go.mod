module example.com/passcount

go 1.26.8

require github.com/kiln-compiler/kiln v0.0.0

require (
	github.com/alecthomas/participle/v2 v2.1.4 // indirect
	github.com/llir/llvm v0.3.6 // indirect
	github.com/mewmew/float v0.0.0-20201204173432-505706aa38fa // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/santhosh-tekuri/jsonschema/v6 v6.0.3 // indirect
	golang.org/x/mod v0.8.0 // indirect
	golang.org/x/sys v0.5.0 // indirect
	golang.org/x/text v0.14.0 // indirect
	golang.org/x/tools v0.6.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

replace github.com/kiln-compiler/kiln => ../..
