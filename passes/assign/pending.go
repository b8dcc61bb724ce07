package assign

import "github.com/kiln-compiler/kiln/ir"

// PendingSends sets held_until on every send of the pipeline stages in m:
// how long its tensor must keep its memory (liveness holds it). That is
// until the stage's first recv of a tensor that the peer sent after
// posting the matching recv (held_until = that recv's tag), or to the end
// of the function when there is none (held_until = -1).
//
// NCCL's send completes only when the peer posts its recv (a rendezvous),
// so a buffer that reused a sent tensor's memory would wait for the peer.
// When the peer's recv comes after the peer's own send to this stage,
// whose recv here is what reuses the memory, each stage waits for the
// other: 1F1B's second microbatch received into the first one's sent
// gradient did exactly that.
//
// Sends and recvs pair in issue order per direction, as NCCL pairs them;
// stages are the functions with the "stage" and "stages" attributes, and
// a peer is offset / ranks stages away. The proof takes the peer's body
// order for the order it posts its calls; a launch plan whose streams
// issue them otherwise is caught by the rendezvous check that kiln
// compile runs (plancheck.Rendezvous).
func PendingSends(m *ir.Module) {
	stages := map[int64]*ir.Func{}
	for _, f := range m.Funcs {
		if f.Attrs["stages"].Kind == 0 || f.Attrs["stage"].Kind == 0 {
			continue
		}
		s := f.Attrs.Int("stage", -1)
		if stages[s] != nil {
			return // two pipelines: which functions pair is not known
		}
		stages[s] = f
	}
	if len(stages) < 2 {
		return
	}
	// at[s][t] lists stage s's sends to t (sent) and recvs from t (recv) by
	// their index in s's body, in issue order.
	type p2p struct{ sent, recv []int }
	at := map[int64]map[int64]*p2p{}
	for s, f := range stages {
		ranks := max(1, f.Attrs.Int("ranks", 1))
		at[s] = map[int64]*p2p{}
		for i, op := range f.Body {
			if op.Kind != "send" && op.Kind != "recv" {
				continue
			}
			t := s + op.Attr().Int("offset")/ranks
			if at[s][t] == nil {
				at[s][t] = &p2p{}
			}
			if op.Kind == "send" {
				at[s][t].sent = append(at[s][t].sent, i)
			} else {
				at[s][t].recv = append(at[s][t].recv, i)
			}
		}
	}
	for s, f := range stages {
		for t, mine := range at[s] {
			theirs := at[t][s]
			for k, i := range mine.sent {
				until := int64(-1)
				if theirs != nil && k < len(theirs.recv) {
					// The peer's first send back after its matching recv;
					// its recv here proves this send complete.
					posted := theirs.recv[k]
					for j, ts := range theirs.sent {
						if ts > posted {
							if j < len(mine.recv) && mine.recv[j] > i {
								until = f.Body[mine.recv[j]].Attr().Int("tag")
							}
							break
						}
					}
				}
				send := f.Body[i]
				send.Attrs = send.Attrs.Clone()
				send.Attrs["held_until"] = ir.IntAttr(until)
			}
		}
	}
}
