package gateway

// PromptKeys is the block keys the picker would send the index for r, nil
// when it would send r's prompt as it is.
func (s *Service) PromptKeys(r *Request) []uint64 {
	_, p := s.hashedPrompt(r)
	return p.GetBlockHashes().GetHashes()
}

// TokenCount is the prompt length r's index deadline counts.
func (r *Request) TokenCount() int { return r.tokenCount() }
