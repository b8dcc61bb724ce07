//go:build !unix

package driver

func addressSpaceLeft() int64 { return 0 }
