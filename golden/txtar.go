package golden

import (
	"bytes"
	"strings"
)

// File is one file of an archive.
type File struct {
	Name string
	Data []byte
}

// Archive is a txtar archive: a free-form comment, then files, each
// introduced by a line "-- NAME --".
type Archive struct {
	Comment []byte
	Files   []File
}

// Parse reads a txtar archive. Text before the first file marker is the
// comment; every file's data ends with a newline when it is not empty.
func Parse(data []byte) *Archive {
	a := &Archive{}
	var cur *File
	var buf []byte
	flush := func() {
		if cur == nil {
			a.Comment = buf
		} else {
			cur.Data = buf
			a.Files = append(a.Files, *cur)
		}
		buf = nil
	}
	for len(data) > 0 {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i+1], data[i+1:]
		} else {
			data = nil
		}
		if name, ok := marker(line); ok {
			flush()
			cur = &File{Name: name}
			continue
		}
		buf = append(buf, line...)
		if len(data) == 0 && len(buf) > 0 && buf[len(buf)-1] != '\n' {
			buf = append(buf, '\n')
		}
	}
	flush()
	return a
}

func marker(line []byte) (string, bool) {
	s := strings.TrimRight(string(line), "\r\n")
	if !strings.HasPrefix(s, "-- ") || !strings.HasSuffix(s, " --") || len(s) < 7 {
		return "", false
	}
	name := strings.TrimSpace(s[3 : len(s)-3])
	return name, name != ""
}

// Format writes the archive back in txtar form.
func Format(a *Archive) []byte {
	var b bytes.Buffer
	b.Write(a.Comment)
	for _, f := range a.Files {
		b.WriteString("-- " + f.Name + " --\n")
		b.Write(f.Data)
		if len(f.Data) > 0 && f.Data[len(f.Data)-1] != '\n' {
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}

// Get returns the data of the named file and whether it exists.
func (a *Archive) Get(name string) ([]byte, bool) {
	for _, f := range a.Files {
		if f.Name == name {
			return f.Data, true
		}
	}
	return nil, false
}

// Set replaces (or appends) the named file.
func (a *Archive) Set(name string, data []byte) {
	for i := range a.Files {
		if a.Files[i].Name == name {
			a.Files[i].Data = data
			return
		}
	}
	a.Files = append(a.Files, File{Name: name, Data: data})
}

// Delete removes the named file if present.
func (a *Archive) Delete(name string) {
	for i := range a.Files {
		if a.Files[i].Name == name {
			a.Files = append(a.Files[:i], a.Files[i+1:]...)
			return
		}
	}
}
